"""How commands print: `--output table` (for people) or `--output json` (for scripts).

Tables keep one line per job in any width: short ids (the shortest unique prefix of at least
8 characters, as git does) unless `--wide`, and columns chosen and cut by priority (id, status,
progress, type, age). JSON has a stable schema (docs/running.md): fields are only ever added.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import typer

from ..console.reader import change_event, key_wait, status_text, waiting_for_worker
from ..jobs.adaptive import windows
from ..jobs.state import DEFAULT_NAMESPACE, DEFAULT_SCOPE, JobState, JobStepState
from ..jobs.status import JobStatus
from ..storage.protocols import StepCounts

SHORT_ID = 8
"""The fewest characters of a short id."""


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOption = Annotated[
    Output, typer.Option("--output", "-o", help="table (for people) or json (for scripts).")
]
WideOption = Annotated[bool, typer.Option("--wide", help="Full ids and untruncated columns.")]


def print_json(value: Any) -> None:
    """JSON on stdout, never highlighted or wrapped, whatever the terminal."""
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False))


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def job_json(job: JobState) -> dict[str, Any]:
    """A job in listings (schema: docs/running.md, "JSON output")."""
    p = job.progress
    return {
        "id": job.id,
        "scope": job.key.scope,
        "namespace": job.key.namespace,
        "type": job.type,
        "status": job.status.name,
        "priority": job.priority,
        "created": _time(job.created),
        "updated": _time(job.last_change),
        "progress": {
            "total": p.total_steps,
            "succeeded": p.successful_steps,
            "failed": p.failed_steps,
            "unreachable": p.unreachable_steps,
            "stopped": p.stopped_steps,
            "stages": [
                {
                    "stage": s.stage,
                    "started": s.is_started,
                    "total": s.total_steps,
                    "succeeded": s.successful_steps,
                    "failed": s.failed_steps,
                    "unreachable": s.unreachable_steps,
                }
                for s in p.stages
            ],
        },
        "details": job.details,
        "waiting_for_worker": _waiting(job),
        "concurrency_key": job.concurrency_key,
        "waiting_for_key": _key_wait(job),
        "adaptive_window": None
        if job.adaptive_window is None
        else job.adaptive_window.model_dump(mode="json"),
        "adaptive_windows": {
            name: window.model_dump(mode="json") for name, window in windows(job).items()
        },
        "quarantine": _quarantine(job),
    }


def _quarantine(job: JobState) -> dict[str, Any] | None:
    quarantine = job.quarantine
    if quarantine is None:
        return None
    return {
        "reason": quarantine.reason,
        "attempts": quarantine.attempts,
        "since": _time(quarantine.since),
    }


def _key_wait(job: JobState) -> dict[str, Any] | None:
    wait = key_wait(job)
    return (
        None if wait is None else {"key": wait.key, "limit": wait.limit, "since": _time(wait.since)}
    )


def _waiting(job: JobState) -> dict[str, Any] | None:
    wait = waiting_for_worker(job)
    return None if wait is None else {"reason": wait.reason, "since": _time(wait.since)}


def job_detail_json(job: JobState, counts: StepCounts) -> dict[str, Any]:
    """A job in `jobs show`: the listing's fields and its history, steps and ownership."""
    owner = job.owner
    return {
        **job_json(job),
        "status_history": [
            {
                "status": _status_name(c.status),
                "at": _time(c.occurred),
                "errors": list(c.exception_messages),
            }
            for c in job.status_changes
        ],
        "step_counts": {status.name: n for status, n in sorted(counts.items())},
        "unreadable_steps": counts.unreadable,
        "step_records_read": counts.verified,
        "owner": None
        if owner is None
        else {
            "host": owner.host,
            "activation": owner.activation_epoch,
            "lease_expires": _time(owner.lease_expires),
        },
        "pending_drain": job.pending_drain,
        "stop_finalized": job.stop_finalized,
        "execution_generation": job.execution_generation,
        "recovery_attempts": job.recovery_attempts,
        "recovery_error": job.recovery_error,
    }


def step_json(step: JobStepState) -> dict[str, Any]:
    """A step in `jobs steps`."""
    error = step.error
    return {
        "id": step.id,
        "job_id": step.job_id,
        "name": step.name,
        "type": step.type,
        "stage": step.stage,
        "status": step.status.name,
        "attempt": step.attempt,
        "generation": step.generation,
        "run": None
        if step.lease is None
        else {
            "host": step.lease.host,
            "node": step.lease.node,
            "activation": step.lease.activation,
            "heartbeat": _time(step.lease.heartbeat),
        },
        "updated": _time(step.status_changes[-1].occurred if step.status_changes else None),
        "error": None
        if error is None
        else {"messages": list(error.messages), "stack_trace": error.stack_trace},
        "waiting_for_key": step.waiting_for_key.text() if step.waiting_for_key else None,
    }


def _status_name(value: int) -> str:
    try:
        return JobStatus(value).name
    except ValueError:
        return str(value)


# -- tables -----------------------------------------------------------------------------------


def short_ids(ids: Iterable[str]) -> dict[str, str]:
    """Each id's shortest prefix of at least SHORT_ID characters that no other id shares."""
    unique = sorted(set(ids))
    short: dict[str, str] = {}
    for i, current in enumerate(unique):
        length = SHORT_ID
        for other in (unique[i - 1] if i else "", unique[i + 1] if i + 1 < len(unique) else ""):
            common = next(
                (n for n, (a, b) in enumerate(zip(current, other, strict=False)) if a != b),
                min(len(current), len(other)),
            )
            length = max(length, common + 1)
        short[current] = current[:length]
    return short


def age(since: datetime, now: datetime) -> str:
    seconds = max(0, int((now - since).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class Column:
    name: str
    width: int
    """What the column needs; the last shrinkable column takes what is left."""
    shrinks: bool = False
    right: bool = False


def lines(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None) -> list[str]:
    """Rows as fixed-width lines no wider than `width` (None: as wide as they need). Columns
    are in priority order: the last ones are dropped first when even shrinking is not enough,
    and a shrinking column is cut with '…'."""
    widths = [max([len(c.name), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    keep = list(range(len(columns)))
    if width is not None:
        while keep:
            fixed = sum(widths[i] for i in keep if not columns[i].shrinks) + 2 * (len(keep) - 1)
            shrinkable = [i for i in keep if columns[i].shrinks]
            room = width - fixed
            if not shrinkable and room >= 0:
                break
            if shrinkable and room >= 4 * len(shrinkable):
                share = room // len(shrinkable)
                for i in shrinkable:
                    widths[i] = min(widths[i], share)
                break
            keep.pop()  # the lowest priority goes
    out = []
    for row in [[c.name for c in columns], *rows]:
        cells = []
        for i in keep:
            text = row[i]
            if len(text) > widths[i]:
                text = text[: widths[i] - 1] + "…"
            cells.append(text.rjust(widths[i]) if columns[i].right else text.ljust(widths[i]))
        out.append("  ".join(cells).rstrip())
    return out


def job_rows(jobs: Sequence[JobState], *, wide: bool, now: datetime) -> list[list[str]]:
    ids = {j.id: j.id for j in jobs} if wide else short_ids(j.id for j in jobs)
    rows = []
    for job in jobs:
        p = job.progress
        done = p.successful_steps + p.failed_steps + p.unreachable_steps
        rows.append(
            [
                ids[job.id],
                status_text(job),
                f"{done}/{p.total_steps}",
                str(job.priority),
                job.type,
                age(job.created, now),
            ]
        )
    return rows


JOB_COLUMNS = (
    Column("id", SHORT_ID),
    Column("status", 22),
    Column("progress", 9, right=True),
    Column("prio", 4, right=True),
    Column("type", 20, shrinks=True),
    Column("age", 4, right=True),
)


def show_jobs(jobs: Sequence[JobState], *, output: Output, wide: bool) -> None:
    """A listing of jobs: a JSON array, or one line per job fitted to the terminal."""
    if output == Output.json:
        print_json([job_json(job) for job in jobs])
        return
    from .common import console

    if not jobs:
        console.print("no jobs", highlight=False)
        return
    rows = job_rows(jobs, wide=wide, now=datetime.now(UTC))
    for line in lines(JOB_COLUMNS, rows, None if wide else console.width):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def history_lines(job: JobState) -> list[str]:
    """The status history, one line a change, each with what it means beside the one before
    (a recovery on another host, a resume, a stop), as the console's history tells it."""
    lines = []
    before: int | None = None
    before_host = ""
    for change in job.status_changes:
        event = change_event(before, before_host, change.status, change.host)
        told = [] if before is None or not event else [event]
        told += change.exception_messages
        why = f"  {'; '.join(told)}" if told else ""
        lines.append(f"  {change.occurred:%Y-%m-%d %H:%M:%S}  {JobStatus(change.status).name}{why}")
        before, before_host = change.status, change.host or before_host
    return lines


def partition_options(scope: str, namespace: str) -> str:
    """` --scope S --namespace N`, leaving out the defaults: for a command to copy."""
    return "".join(
        f" --{name} {value}"
        for name, value, default in (
            ("scope", scope, DEFAULT_SCOPE),
            ("namespace", namespace, DEFAULT_NAMESPACE),
        )
        if value != default
    )


def waiting_text(job: Any) -> str:
    """ "waiting for a worker: <reason>" for a job that waits for one, else ""."""
    wait = job.waiting_for_worker
    return f"waiting for a worker: {wait.reason}" if wait is not None else ""


def quarantine_lines(job: Any) -> list[str]:
    """What `jobs show` says of a job recovery gave up on (none for another job): why, and the
    command that takes it out."""
    from ..console.reader import quarantine_text

    if job.quarantine is None:
        return []
    where = partition_options(job.key.scope, job.key.namespace)
    return [
        quarantine_text(job),
        f"recovery no longer resumes it; `choreography jobs resume {job.id}{where}` takes it "
        "out of quarantine and resumes it",
    ]
