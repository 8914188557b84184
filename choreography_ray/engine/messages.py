"""What jobs and workers say to each other. Plain values: they cross process boundaries.

A job dispatches `StepStart`s to a worker in batches and hears back `StepReport`s in batches.
Every message carries the job's execution generation, so a report of an earlier execution is
never mistaken for one of the current.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NamedTuple

from ..jobs.errors import StartJobStepError
from ..jobs.state import JobKey, StepDecision, StepError
from ..jobs.status import JobStepStatus

Prepared = Sequence[Any]
"""A step's record as its job just prepared and stored it: (step type, name, stage, state
type, state data, stored version, plan position); a job host of the previous release sends
the first six, and a worker host of that release is sent them (`pack_starts`). A tuple where
the job holds it, a list once it has crossed (`pack_starts`)."""


class StepStart(NamedTuple):
    """Tuples, not dataclasses: thousands cross a process boundary per second."""

    step_id: str
    generation: int
    attempt: int = 1
    prepared: Prepared | None = None
    """Set on a step's first start after its job prepared it in the same activation: the
    worker builds the record from it instead of reading it back. The record's version makes
    its first write a compare-and-set against what the job stored, so a record that changed
    meanwhile is found stale, as a read one would be."""
    urgent: bool = False
    """A start sent again after its run was lost (its host died, it was moved): the worker
    queues it ahead of the job's other runs, which arrived after it the first time."""


class StartOutcome(IntEnum):
    STARTED = 0
    ALREADY_STARTED = 1
    COMPLETED = 2
    FAILED = 3
    RUNNING_ELSEWHERE = 4
    """Another live host runs the step (its `reason` names the host): the job tracks it there."""


class StartResult(NamedTuple):
    step_id: str
    outcome: StartOutcome
    error: StartJobStepError | None = None
    reason: str = ""
    report: StepReport | None = None
    """For a step found already finished: its stored outcome, so the job can count it."""


class StepReport(NamedTuple):
    """A step's outcome, already persisted by the worker when it is sent."""

    step_id: str
    status: JobStepStatus
    generation: int
    attempt: int
    stage: int = 0
    name: str = ""
    result: tuple[str, Any] | None = None
    """The result (or partial result) as (type name, JSON data): plain data crosses processes
    far faster than a pydantic model."""
    error: StepError | None = None
    decision: StepDecision | None = None
    """The job's decision on this failed attempt, when one is stored with it (a stored
    outcome read back); a run's fresh report has none yet."""


class StopRequest(NamedTuple):
    job_key: JobKey
    job_id: str
    generation: int
    step_ids: tuple[str, ...] | None = None
    """None stops every step of the job the worker runs."""
    removing: bool = False


@dataclass(slots=True)
class StopResult:
    stopping: list[str] = field(default_factory=list)
    """Steps whose runs were told to stop; each reports once it settles."""
    not_running: list[str] = field(default_factory=list)
    hosts: dict[str, list[str]] = field(default_factory=dict)
    """Which worker host is stopping which steps (filled in by the dispatcher), so a host lost
    mid-stop is known to have taken its steps with it."""


@dataclass(slots=True)
class SettledStops:
    """What a stop that waits for the work answers (`StepWorker.stop_and_wait`)."""

    settled: list[StepReport] = field(default_factory=list)
    """Outcomes persisted before the deadline: each the step's own answer."""
    timed_out: list[str] = field(default_factory=list)
    """Steps that did not answer with a persisted outcome by the deadline (the seed's
    StopTimedOut): their callbacks are refused from then on, and each reports its outcome once
    it settles."""


# -- across processes ---------------------------------------------------------------------------
# Ray pickles a named tuple about ten times slower than a plain one (2.8 µs against 0.2 µs per
# message, measured on 1,000), and an enum member by name. Lists cost less still: Ray packs an
# argument with msgpack, which takes lists, strings, numbers and None itself, and hands every
# tuple to a Python callback that pickles it apart (about a microsecond more a message, sent
# and read; decisions.md). Hosts send lists of plain values and plain ints, and rebuild the
# messages on arrival. Every release unpacks them by position, so a list reads as the tuple it
# replaced did.

_STEP_STATUSES = {int(status): status for status in JobStepStatus}

PackedStart = list[Any]
"""A `StepStart`'s fields in order: four for a host without the `work-moves` capability."""
PackedReport = list[Any]
"""A `StepReport`'s fields in order, its status as an int, its result as a list, its decision
as JSON. Where the decision goes, the previous release sent (and reads, by its truth) whether
the failure was non-retryable: a host of that release gets that flag there, never a decision
(`previous_flag`), and a flag read there is no decision (the error says the same)."""


def pack_starts(
    starts: Sequence[StepStart], *, urgency: bool = True, positions: bool = True
) -> list[PackedStart]:
    """Lists of plain values; without `urgency` (a host of an older release) the fifth field
    is left out, as that release reads four; without `positions` a carried record is cut to
    the six fields the previous release reads."""
    cut = 7 if positions else 6
    if urgency:
        return [
            [step, generation, attempt, None if record is None else list(record[:cut]), urgent]
            for step, generation, attempt, record, urgent in starts
        ]
    return [
        [step, generation, attempt, None if record is None else list(record[:cut])]
        for step, generation, attempt, record, _ in starts
    ]


def unpack_starts(packed: Sequence[PackedStart]) -> list[StepStart]:
    return [StepStart(*fields) for fields in packed]


def previous_flag(report: StepReport) -> bool:
    """The previous release's `non_retryable` for `report`: the error's own flag, or a final
    decision stored for this attempt, so that a host of that release never retries what this
    job decided final. A stored retry reads False: that host's own rule decides it then."""
    if report.error is not None and report.error.non_retryable:
        return True
    decision = report.decision
    return decision is not None and decision.attempt == report.attempt and not decision.retry


def pack_reports(reports: Sequence[StepReport], *, decisions: bool = True) -> list[PackedReport]:
    """Lists of plain values; without `decisions` (a controller host of the previous release,
    which reads nine fields, the last its flag by its truth) every last field is
    `previous_flag`."""
    return [
        [
            r.step_id,
            int(r.status),
            r.generation,
            r.attempt,
            r.stage,
            r.name,
            None if r.result is None else list(r.result),
            r.error,
            r.decision.model_dump_json()
            if decisions and r.decision is not None
            else previous_flag(r),
        ]
        for r in reports
    ]


def unpack_reports(packed: Sequence[PackedReport]) -> list[StepReport]:
    statuses = _STEP_STATUSES
    return [
        StepReport(
            step_id,
            statuses[status],
            generation,
            attempt,
            stage,
            name,
            None if result is None else (result[0], result[1]),
            error,
            StepDecision.model_validate_json(decision) if isinstance(decision, str) else None,
        )
        for step_id, status, generation, attempt, stage, name, result, error, decision in packed
    ]


def for_previous_release(report: StepReport) -> StepReport:
    """`report` as a host of the previous release reads it when it crosses as itself (a start's
    answer): Ray pickles it field by field, and that release's `StepReport` has its
    `non_retryable` flag where the decision is (and no `StepDecision` to unpickle)."""
    return StepReport._make((*report[:-1], previous_flag(report)))


def arrived(report: StepReport) -> StepReport:
    """`report` as it came from another host: one from a worker host of the previous release
    has its `non_retryable` flag where the decision goes, which is no decision (its error
    holds the same flag)."""
    if report.decision is None or isinstance(report.decision, StepDecision):
        return report
    return report._replace(decision=None)


def exceptional(results: Sequence[StartResult], *, decisions: bool = True) -> list[StartResult]:
    """The results worth sending back: a start with none simply started. Without
    `decisions` (a controller host of the previous release) a stored outcome's report is
    sent in that release's shape (`for_previous_release`)."""
    found = [result for result in results if result.outcome != StartOutcome.STARTED]
    if decisions:
        return found
    return [
        result._replace(report=for_previous_release(result.report))
        if result.report is not None
        else result
        for result in found
    ]
