"""The console's pages as HTML: jobs, one job, its steps, the cluster.

Pure functions of what the reader returned, so they are tested without a server. Buttons of
actions the job's state makes meaningless are rendered disabled, with the reason as a title.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from ..jobs.adaptive import window_lines
from ..jobs.state import JobKey, JobStageProgress, JobState
from ..jobs.status import JobStatus
from ..storage.protocols import StepCounts
from .html import bar, duration, e, key_params, path, url, when
from .pace import chart, pace_text
from .ports import ACTIONS, ClusterSnapshot, HostView
from .reader import (
    change_event,
    key_wait,
    quarantine_text,
    stage_state,
    status_text,
    step_status_name,
    waiting_for_worker,
)

_NO_STAGES = (
    '<tr><td colspan="6" class="muted">no stage figures: the job has not planned yet, or '
    "finished without keeping them</td></tr>"
)


def status_name(status: int) -> str:
    try:
        return JobStatus(status).name
    except ValueError:
        return str(status)


def job_link(job_id: str, key: JobKey) -> str:
    return url(path("jobs", job_id), key_params(key))


def select_options(selected: str, names: Iterable[str]) -> str:
    out = ['<option value="">any</option>']
    for name in names:
        mark = " selected" if name.lower() == selected.lower() else ""
        out.append(f'<option value="{e(name.lower())}"{mark}>{e(name.lower())}</option>')
    return "".join(out)


def _action_reason(action: str, job: JobState, can_drain: bool) -> str:
    """Why `action` means nothing for the job now; empty when it may be done."""
    status = job.status
    if action in ("stop", "drain"):
        if action == "drain" and not can_drain:
            return "this cluster's client has no drain"
        if not status.is_running:
            return f"the job is {status.name.lower()}, not running"
        if job.pending_drain:
            return "a drain is under way"
    if action == "resume" and status != JobStatus.STOPPED and job.quarantine is None:
        return f"only a stopped or quarantined job resumes; this one is {status.name.lower()}"
    if action == "retry-failed":
        finished_stop = status == JobStatus.STOPPED and job.stop_finalized
        if status != JobStatus.COMPLETED_WITH_FAILURES and not finished_stop:
            return "only a job completed with failures, or stopped, runs its failed steps again"
        if not job.progress.failed_steps:
            return "the job has no failed steps"
    if action == "remove" and (status.is_terminal or status == JobStatus.REMOVING):
        return f"the job is {status.name.lower()}: completed jobs are not removed"
    return ""


def actions_form(job: JobState, *, enabled: bool, can_drain: bool, token: str) -> str:
    if not enabled:
        return (
            '<p class="muted">Read-only: start the console with --allow-actions to stop, '
            "drain, resume, retry or remove jobs.</p>"
        )
    buttons = []
    for action in ACTIONS:
        why = _action_reason(action, job, can_drain)
        target = url(path("jobs", job.id, action), key_params(job.key))
        label = action.replace("-", " ").capitalize()
        question = f"{label} job {job.id}?"
        disabled = f' disabled title="{e(why)}"' if why else ""
        buttons.append(
            f'<form class="inline" method="post" action="{e(target)}" '
            f'data-confirm="{e(question)}" onsubmit="return confirm(this.dataset.confirm)">'
            f'<input type="hidden" name="token" value="{e(token)}">'
            f'<button type="submit" name="action" value="{action}"{disabled}>'
            f"{label}</button></form>"
        )
    return '<div class="actions">' + "".join(buttons) + "</div>"


def _status(job: JobState) -> str:
    return job.status.name + (" (quarantined)" if job.quarantine is not None else "")


def _stage_bar(stage: JobStageProgress) -> str:
    done = stage.total_steps - stage.remaining_steps
    return bar(done, stage.total_steps, stage.failed_steps + stage.unreachable_steps)


def facts_table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><td>{e(name)}</td><td>{value}</td></tr>" for name, value in rows)
    return f'<table class="facts">{body}</table>'


def history_rows(job: JobState) -> str:
    """The status history as the story it tells: each change, the host that made it, and what
    it means beside the one before (a recovery on another host, a resume after a stop or an
    interruption), with a quarantine where it began."""
    rows: list[tuple[datetime, str]] = []
    before: int | None = None
    before_host = ""
    for change in job.status_changes:
        event = change_event(before, before_host, change.status, change.host)
        why = "; ".join(change.exception_messages)
        trace = (
            f"<details><summary>stack trace</summary><pre>{e(change.exception_stack_trace)}"
            "</pre></details>"
            if change.exception_stack_trace
            else ""
        )
        rows.append(
            (
                change.occurred,
                f"<tr><td>{e(when(change.occurred))}</td><td>{e(status_name(change.status))}</td>"
                f"<td>{e(change.host)}</td><td>{e(event)}</td><td>{e(why)}{trace}</td></tr>",
            )
        )
        before, before_host = change.status, change.host or before_host
    quarantine = job.quarantine
    if quarantine is not None:
        rows.append(
            (
                quarantine.since,
                f"<tr><td>{e(when(quarantine.since))}</td><td>QUARANTINED</td><td></td>"
                f"<td>quarantined after {quarantine.attempts} recovery attempts in a row</td>"
                f"<td>{e(quarantine.reason)}</td></tr>",
            )
        )
    return "".join(row for _, row in sorted(rows, key=lambda item: item[0]))


def job_page(
    job: JobState,
    counts: StepCounts,
    now: datetime,
    *,
    actions: str,
    failures: str = "",
    message: str = "",
    problem: str = "",
) -> str:
    p = job.progress
    last = job.status_changes[-1].occurred if job.status_changes else job.created
    ended = job.is_finished
    elapsed = ((last if ended else now) - job.created).total_seconds()
    owner = '<span class="muted">none recorded</span>'
    if job.owner is not None:
        lease = job.owner.lease_expires
        lease_text = f", lease until {when(lease)} UTC" if lease is not None else ""
        if lease is not None and lease < now and not ended:
            lease_text += " (expired)"
        owner = f"{e(job.owner.host)} (activation {job.owner.activation_epoch}{e(lease_text)})"
    if job.has_stored_step_plan:
        plan = (
            f"{p.total_steps} steps, stored apart (incarnation {job.stored_step_plan_incarnation})"
        )
    elif job.plan is not None:
        plan = f"{len(job.plan)} steps, inline in the job record"
    else:
        plan = f"{p.total_steps} steps"
    state = []
    if job.quarantine is not None:
        state.append(f"{quarantine_text(job)}; Resume takes it out of quarantine")
    wait = waiting_for_worker(job)
    if wait is not None:
        state.append(f"waiting for a worker since {when(wait.since)} UTC: {wait.reason}")
    keyed = key_wait(job)
    if keyed is not None:
        state.append(f"{keyed.text()} since {when(keyed.since)} UTC")
    if job.pending_drain:
        state.append("draining: running steps finish, no new step starts")
    if job.status == JobStatus.STOPPED:
        state.append("stop finished" if job.stop_finalized else "stop under way")
    if job.status.is_running and job.owner is not None and job.quarantine is None:
        lease = job.owner.lease_expires
        if lease is not None and lease < now:
            state.append("owner's lease expired: the next sweep or call recovers it")
    if counts.unreadable:
        state.append(f"{counts.unreadable} step record(s) cannot be read; it will not resume")
    request = e(job.request.model_dump_json() if job.request is not None else "")
    facts = facts_table(
        [
            ("status", f'<span class="status">{job_badge(job)}</span>'),
            ("type", e(job.type)),
            ("partition", e(job.key)),
            ("priority", str(job.priority)),
            ("adaptive windows", "<br>".join(e(line) for line in window_lines(job)) or "—"),
            ("progress", bar(p.done_steps, p.total_steps, p.failed_steps + p.unreachable_steps)),
            ("pace", e(pace_text(job, now)) if not ended else '<span class="muted">—</span>'),
            ("over time", chart(job, now)),
            ("created", e(when(job.created)) + " UTC"),
            ("last change", e(when(last)) + " UTC"),
            ("running for" if not ended else "ran for", e(duration(elapsed))),
            ("plan", e(plan)),
            ("owner host", owner),
            ("execution generation", str(job.execution_generation)),
            ("state", e("; ".join(state)) or '<span class="muted">—</span>'),
            ("details", e(job.details)),
            ("message", e(p.message)),
            ("request", f"<code>{request}</code>"),
        ]
    )
    stages = "".join(
        f"<tr><td>{s.stage}</td><td>{stage_state(s)}</td>"
        f"<td>{_stage_bar(s)}</td>"
        f'<td class="num">{s.successful_steps}</td><td class="num">{s.failed_steps}</td>'
        f'<td class="num">{s.unreachable_steps}</td></tr>'
        for s in p.stages
    )
    key = key_params(job.key)
    count_rows = "".join(
        f'<tr><td><a href="{e(url(path("jobs", job.id, "steps"), {**key, "status": s.name}))}">'
        f'{e(step_status_name(s).lower())}</a></td><td class="num">{n}</td></tr>'
        for s, n in sorted(counts.items())
    )
    if counts.unreadable:
        count_rows += f'<tr><td>unreadable</td><td class="num">{counts.unreadable}</td></tr>'
    history = history_rows(job)
    notices = ""
    if message:
        notices += f'<p class="notice">{e(message)}</p>'
    if problem:
        notices += f'<p class="error">{e(problem)}</p>'
    steps_link = url(path("jobs", job.id, "steps"), key)
    return (
        f"<h1>Job <code>{e(job.id)}</code> {job_badge(job)}</h1>{notices}{actions}"
        f"{failures}{facts}"
        "<h2>Stages</h2><table><thead><tr><th>stage</th><th></th><th>progress</th>"
        "<th>succeeded</th><th>failed</th><th>unreachable</th></tr></thead>"
        f"<tbody>{stages or _NO_STAGES}</tbody></table>"
        f'<h2>Steps by status <a href="{e(steps_link)}">(all steps)</a></h2>'
        f"<table><tbody>{count_rows or '<tr><td class=muted>no step records</td></tr>'}"
        f"</tbody></table>"
        '<h2>History</h2><table class="history"><thead><tr><th>when (UTC)</th><th>status</th>'
        f"<th>host</th><th>what happened</th><th>why</th></tr></thead><tbody>{history}</tbody>"
        "</table>"
    )


def job_badge(job: JobState) -> str:
    return f'<span class="badge j-{e(job.status.name.lower())}">{e(status_text(job))}</span>'


def cluster_page(snapshot: ClusterSnapshot | None, source: str, problem: str = "") -> str:
    if snapshot is None:
        why = f" ({e(problem)})" if problem else ""
        return (
            '<h1>Cluster</h1><p class="error">Not connected to a cluster'
            f"{why}: this console reads the storage {e(source)} only. Start it without "
            "--storage (or with --address) to see the nodes, hosts and live activations.</p>"
        )
    rows = []
    for node in snapshot.nodes:
        roles = ", ".join(
            r for r, on in (("controller", node.controller), ("worker", node.worker)) if on
        )
        hosts = "<br>".join(_host_line(h) for h in node.hosts)
        node_id = f"<code>{e(node.node_id[:12])}</code>"
        if node.logs_url:
            node_id = (
                f'<a href="{e(node.logs_url)}" title="this node in Ray\'s dashboard">{node_id}</a>'
            )
        labels = " ".join(f"<code>{e(k)}={e(v)}</code>" for k, v in sorted(node.labels.items()))
        memory = f"{node.memory_bytes / 2**30:.1f} GiB" if node.memory_bytes else "—"
        rows.append(
            f"<tr><td>{node_id}</td><td>{e(node.hostname)}</td>"
            f"<td>{e(node.address)}</td><td>{'alive' if node.alive else 'dead'}</td>"
            f'<td>{e(roles) or "—"}</td><td class="num">{node.cpus:g}</td>'
            f'<td class="num">{memory}</td><td>{labels or "—"}</td><td>{hosts}</td></tr>'
        )
    return (
        f'<h1>Cluster <span class="muted">(Ray namespace {e(snapshot.namespace)})</span></h1>'
        "<table><thead><tr><th>node</th><th>host name</th><th>address</th><th>state</th>"
        "<th>roles</th><th>CPUs</th><th>memory</th><th>labels</th><th>hosts</th></tr></thead>"
        "<tbody>" + "".join(rows) + "</tbody></table>"
        f"<h2>Job modules</h2><p>{e(', '.join(snapshot.modules)) or '—'}</p>"
        f"<h2>Job types</h2><p>{e(', '.join(snapshot.job_types)) or '—'}</p>"
    )


def _host_line(host: HostView) -> str:
    """A host actor: its role and live figures, and a link to its logs when there is one."""
    figures = [host.role]
    if host.live_jobs is not None:
        figures.append(f"{host.live_jobs} live job activations")
    if host.active_runs is not None:
        figures.append(f"{host.active_runs} running steps")
    if host.max_parallel_steps:
        figures.append(f"at most {host.max_parallel_steps} at once")
    if host.steps_per_second is not None:
        figures.append(f"{host.steps_per_second:,.1f} steps/s")
    if host.problem:
        figures.append(host.problem)
    logs = f' <a href="{e(host.logs_url)}">logs</a>' if host.logs_url else ""
    return f"<code>{e(host.name)}</code> ({e(', '.join(figures))}){logs}"


def now_utc() -> datetime:
    return datetime.now(UTC)
