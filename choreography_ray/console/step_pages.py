"""The console's pages of steps: a job's steps a page at a time, one step, and the failed
steps its job's page opens with.

Pure functions of what the reader returned, as the other pages are.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ..jobs.state import JobState, JobStepState
from ..jobs.status import FAILED_STEP_STATUSES, JobStepStatus
from ..storage.step_query import StepOrder, StepQuery
from .html import duration, e, key_params, path, url, when
from .pages import facts_table, job_badge, job_link, select_options
from .reader import FAILED_STEPS, PREPARED, StepListing, step_status_name

STEP_STATUSES = [s for s in JobStepStatus if s not in (JobStepStatus.UNKNOWN, JobStepStatus.FAILED)]
"""The statuses a steps page filters by one at a time: `prepared` stands for UNKNOWN, and
`failed` for FAILED with COMPLETED_WITH_FAILURE."""


def failed_steps(job: JobState, failed: StepListing) -> str:
    """The job's failed steps, the latest first, each with its error and a link to it: what
    an operator opens the page for."""
    if not failed.steps:
        return ""
    rows = "".join(
        f'<li data-failed-step="{e(step.id)}"><a href="{e(step_link(job, step.id))}">'
        f"<code>{e(step.id)}</code></a> {e(step.name)} {step_badge(step.status)} "
        f"attempt {step.attempt}{step_error(step)}</li>"
        for step in failed.steps
    )
    more = ""
    if failed.total > len(failed.steps):
        target = url(path("jobs", job.id, "steps"), {**key_params(job.key), "status": "failed"})
        more = f'<p><a href="{e(target)}">all {failed.total} failed steps →</a></p>'
    return (
        f'<section class="failures"><h2>Failed steps ({failed.total})</h2>'
        f'<ol class="failed-steps">{rows}</ol>{more}</section>'
    )


def _step_params(job: JobState, query: StepQuery) -> dict[str, object]:
    """A steps page's query string, its cursor aside."""
    return {
        **key_params(job.key),
        "status": ",".join(sorted(step_status_name(s).lower() for s in query.statuses)),
        "stage": "" if query.stage is None else query.stage,
        "type": query.type or "",
        "prefix": query.id_prefix,
        "order": query.order.value if query.order is not StepOrder.PLAN else "",
        "size": query.take,
    }


def _selected_status(query: StepQuery) -> str:
    if query.statuses == FAILED_STEP_STATUSES:
        return FAILED_STEPS
    if len(query.statuses) == 1:
        return step_status_name(next(iter(query.statuses))).lower()
    return ""


def steps_filters(job: JobState, query: StepQuery) -> str:
    orders = "".join(
        f'<option value="{o.value}"{" selected" if o is query.order else ""}>{label}</option>'
        for o, label in ((StepOrder.PLAN, "plan order"), (StepOrder.CHANGED, "last change"))
    )
    names = [FAILED_STEPS, PREPARED, *(s.name for s in STEP_STATUSES)]
    return (
        f'<form method="get" action="{e(path("jobs", job.id, "steps"))}" class="step-filters">'
        f'<input type="hidden" name="scope" value="{e(job.key.scope)}">'
        f'<input type="hidden" name="namespace" value="{e(job.key.namespace)}">'
        f'<input type="hidden" name="size" value="{query.take}">'
        f'id <input name="prefix" value="{e(query.id_prefix)}" size="16" '
        'placeholder="id or prefix" aria-label="step id or prefix"> '
        f'status <select name="status">{select_options(_selected_status(query), names)}</select> '
        f'stage <input name="stage" value="{"" if query.stage is None else query.stage}" '
        'size="3" inputmode="numeric"> '
        f'type <input name="type" value="{e(query.type or "")}" size="16"> '
        f'order <select name="order">{orders}</select> '
        '<button type="submit">Filter</button></form>'
    )


def step_badge(status: JobStepStatus) -> str:
    """A step's status as a coloured badge whose text says it (colour is never all)."""
    name = step_status_name(status)
    return f'<span class="badge s-{e(name.lower())}">{e(name)}</span>'


def step_error(step: JobStepState) -> str:
    """The step's error messages, with its stack trace folded under them."""
    if step.error is None or not (step.error.messages or step.error.stack_trace):
        return ""
    error = f'<div class="step-error">{e("; ".join(step.error.messages))}</div>'
    if step.error.stack_trace:
        error += (
            "<details><summary>stack trace</summary>"
            f"<pre>{e(step.error.stack_trace)}</pre></details>"
        )
    return error


def _step_host(step: JobStepState) -> str:
    if step.lease is None:
        return ""
    host = step.lease.host or step.lease.node
    if step.status == JobStepStatus.RUNNING:
        beat = step.lease.heartbeat.astimezone(UTC).strftime("%H:%M:%S")
        host = f"{host} (heartbeat {beat})"
    return host


def _progress(step: JobStepState) -> str:
    """Its progress message, or why it waits for its step-level concurrency key."""
    wait = step.waiting_for_key
    return wait.text() if wait is not None else step.progress.message


def step_link(job: JobState, step_id: str) -> str:
    return url(path("jobs", job.id, "steps", step_id), key_params(job.key))


def steps_page(job: JobState, query: StepQuery, found: StepListing, now: datetime) -> str:
    rows = []
    for step in found.steps:
        rows.append(
            f'<tr data-step="{e(step.id)}"><td><a href="{e(step_link(job, step.id))}">'
            f"<code>{e(step.id)}</code></a></td>"
            f"<td>{e(step.name)}</td><td>{e(step.type)}</td><td>{step.stage}</td>"
            f'<td class="status">{step_badge(step.status)}</td>'
            f'<td class="num">{step.attempt}</td>'
            f"<td>{step.progress.percentage:.0f}% {e(_progress(step))}</td>"
            f"<td>{e(when(step.last_change))}</td><td>{e(_step_host(step))}</td>"
            f'<td class="trace">{step_error(step)}</td></tr>'
        )
    params = _step_params(job, query)
    base = path("jobs", job.id, "steps")

    def sort_link(label: str, order: StepOrder) -> str:
        if order is query.order:
            return f'{label} <span aria-label="sorted">▾</span>'
        target = url(base, {**params, "order": order.value})
        return f'<a href="{e(target)}" title="sort by {label}">{label}</a>'

    pager = [f'<span class="total">{found.total} matching steps</span>']
    if query.after is not None:
        pager.append(f'<a rel="first" href="{e(url(base, params))}">⇤ first page</a>')
    if found.next is not None:
        target = url(base, {**params, "after": found.next.token()})
        pager.append(f'<a rel="next" href="{e(target)}">next →</a>')
    return (
        f'<h1>Steps of <a href="{e(job_link(job.id, job.key))}"><code>{e(job.id)}</code></a>'
        f" {job_badge(job)}</h1>"
        "<table><thead><tr><th>id</th><th>name</th><th>type</th>"
        f"<th>{sort_link('stage', StepOrder.PLAN)}</th><th>status</th>"
        f"<th>attempt</th><th>progress</th><th>{sort_link('last change', StepOrder.CHANGED)}"
        " (UTC)</th><th>host</th><th>error</th></tr></thead><tbody>"
        + ("".join(rows) or '<tr><td colspan="10" class="muted">no steps</td></tr>')
        + "</tbody></table>"
        + f'<p class="pager">{" · ".join(pager)}</p>'
    )


def step_page(job: JobState, step: JobStepState, now: datetime) -> str:
    """One step: where it stands, its attempts and error, its checkpoint, who runs it."""
    lease = step.lease
    runs = '<span class="muted">no lease: not running</span>'
    if lease is not None:
        beat = when(lease.heartbeat)
        age = duration((now - lease.heartbeat).total_seconds())
        runs = (
            f"host {e(lease.host or '—')} on node <code>{e(lease.node)}</code>, activation "
            f"<code>{e(lease.activation)}</code>, last heartbeat {e(beat)} UTC ({e(age)} ago)"
        )
    decision = step.decision
    decided = '<span class="muted">—</span>'
    if decision is not None:
        decided = e(
            f"attempt {decision.attempt}: "
            + (f"retry at {when(decision.retry_at)} UTC" if decision.retry else "final")
        )
    checkpoint = e(step.state.model_dump_json() if step.state is not None else "")
    result = e(step.result.model_dump_json() if step.result is not None else "")
    facts = facts_table(
        [
            ("status", step_badge(step.status)),
            ("name", e(step.name)),
            ("type", e(step.type)),
            ("stage", f"{step.stage} (place {step.position} in the plan)"),
            ("attempt", f"{step.attempt} (generation {step.generation})"),
            ("progress", e(f"{step.progress.percentage:.0f}% {_progress(step)}")),
            ("last change", e(when(step.last_change)) + " UTC" if step.last_change else "—"),
            ("runs on", runs),
            ("retry decision", decided),
            ("error", step_error(step) or '<span class="muted">none</span>'),
            ("checkpoint", f"<code>{checkpoint}</code>"),
            ("result", f"<code>{result}</code>" if result else '<span class="muted">—</span>'),
        ]
    )
    history = "".join(
        f"<tr><td>{e(when(c.occurred))}</td><td>{e(_step_status(c.status))}</td>"
        f"<td>{e('; '.join(c.exception_messages))}</td></tr>"
        for c in step.status_changes
    )
    back = url(path("jobs", job.id, "steps"), key_params(job.key))
    return (
        f'<h1>Step <code>{e(step.id)}</code> of <a href="{e(job_link(job.id, job.key))}">'
        f"<code>{e(job.id)}</code></a></h1>{facts}"
        "<h2>Status history</h2><table><thead><tr><th>when (UTC)</th><th>status</th>"
        f"<th>why</th></tr></thead><tbody>{history}</tbody></table>"
        f'<p><a href="{e(back)}">← all steps</a></p>'
    )


def _step_status(status: int) -> str:
    try:
        return step_status_name(JobStepStatus(status))
    except ValueError:
        return str(status)
