"""Step reports between two releases during a rolling upgrade.

Where a report now carries the job's stored decision, the previous release sent (and reads) a
bool `non_retryable`: its controller takes a truthy value there as "never retry". A report
crosses twice: packed, with a worker's outcomes (`deliver`), and as itself, pickled field by
field, in a start's answer for a step whose record already holds its outcome. Each is sent in
the shape its reader reads, and this release reads the previous release's.
"""

from __future__ import annotations

import io
import pickle
from datetime import UTC, datetime
from typing import Any, NamedTuple

import pytest

from choreography_ray.engine.messages import (
    PackedReport,
    SettledStops,
    StartOutcome,
    StartResult,
    StepReport,
    exceptional,
    pack_reports,
)
from choreography_ray.engine.stored_steps import outcome_report
from choreography_ray.jobs import JobStatus
from choreography_ray.jobs.state import JobStepState, StepDecision, StepError
from choreography_ray.jobs.status import JobStepStatus

from .fixtures import RetryingJob, ScenarioJob, request

RETRY_AT = datetime(2026, 1, 1, tzinfo=UTC)


def failed(
    step_id: str, *, non_retryable: bool = False, decision: StepDecision | None = None
) -> StepReport:
    return StepReport(
        step_id,
        JobStepStatus.COMPLETED_WITH_FAILURE,
        1,
        2,
        error=StepError(messages=["no"], non_retryable=non_retryable),
        decision=decision,
    )


REPORTS = [
    failed("retry", decision=StepDecision(attempt=2, retry=True, retry_at=RETRY_AT)),
    failed("final", decision=StepDecision(attempt=2, retry=False)),
    failed("earlier", decision=StepDecision(attempt=1, retry=False)),  # another attempt's
    failed("fresh"),
    failed("no-retry", non_retryable=True),
]
PREVIOUS_FLAGS = [
    ("retry", False),  # that host's own rule decides the retry
    ("final", True),  # it never retries what this job decided final
    ("earlier", False),
    ("fresh", False),
    ("no-retry", True),
]


# -- the previous release's reader ----------------------------------------------------------


def previous_release_reads(packed: list[PackedReport]) -> list[tuple[str, bool]]:
    """What the previous release's controller reads from packed reports: its `unpack_reports`
    takes exactly nine fields, the last its `non_retryable` flag, read by its truth."""
    return [
        (step_id, bool(flag))
        for step_id, status, generation, attempt, stage, name, result, error, flag in packed
    ]


class PreviousStepReport(NamedTuple):
    """The previous release's `StepReport`."""

    step_id: str
    status: JobStepStatus
    generation: int
    attempt: int
    stage: int = 0
    name: str = ""
    result: tuple[str, Any] | None = None
    error: StepError | None = None
    non_retryable: bool = False


class PreviousReleaseUnpickler(pickle.Unpickler):
    """Unpickles as a host of the previous release: its `StepReport` is the one above, and it
    has no `StepDecision`."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("choreography_ray.engine.messages", "StepReport"):
            return PreviousStepReport
        if (module, name) == ("choreography_ray.jobs.state", "StepDecision"):
            raise AttributeError(f"Can't get attribute {name!r} on module {module!r}")
        return super().find_class(module, name)


def across_to_previous_release(value: Any) -> Any:
    return PreviousReleaseUnpickler(io.BytesIO(pickle.dumps(value))).load()


class PreviousReleasePickler(pickle.Pickler):
    """Pickles as a host of the previous release: its `StepReport` goes by this release's name,
    field by field."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is PreviousStepReport:
            return StepReport, tuple(obj)
        return NotImplemented


def across_from_previous_release(value: Any) -> Any:
    stream = io.BytesIO()
    PreviousReleasePickler(stream).dump(value)
    return pickle.loads(stream.getvalue())


# -- this release to the previous one --------------------------------------------------------


def test_reports_packed_for_the_previous_release_give_it_the_right_flag() -> None:
    assert previous_release_reads(pack_reports(REPORTS, decisions=False)) == PREVIOUS_FLAGS


def test_reports_packed_for_this_release_keep_their_decisions() -> None:
    packed = pack_reports(REPORTS)
    assert [fields[-1] for fields in packed][:3] == [
        report.decision.model_dump_json() for report in REPORTS[:3] if report.decision
    ]
    assert [fields[-1] for fields in packed][3:] == [False, True]


def test_a_start_s_answer_for_the_previous_release_gives_it_the_right_flag() -> None:
    answers = [StartResult(r.step_id, StartOutcome.COMPLETED, report=r) for r in REPORTS]
    started = StartResult("started", StartOutcome.STARTED)
    read = across_to_previous_release(exceptional([*answers, started], decisions=False))
    assert [(r.report.step_id, r.report.non_retryable) for r in read] == PREVIOUS_FLAGS
    assert all(type(r.report) is PreviousStepReport for r in read)
    assert [r.report.error for r in read] == [r.error for r in REPORTS]
    # In this release's shape that host cannot even read the answer.
    with pytest.raises(AttributeError, match="StepDecision"):
        across_to_previous_release(exceptional(answers))


def test_a_report_carries_only_its_own_attempt_s_decision() -> None:
    """A run of attempt 2 stopped before it performed reports from the record it read, which
    still holds attempt 1's decision: its report (in a drain's answer, unpickled by the
    previous release as it is) carries none."""
    decided = StepDecision(attempt=1, retry=True, retry_at=RETRY_AT)
    stopped = JobStepState(
        id="s", job_id="j", type="t", status=JobStepStatus.STOPPED, attempt=1, decision=decided
    )
    report = outcome_report(stopped, 1, 2)
    assert report.decision is None
    [read] = across_to_previous_release(SettledStops(settled=[report])).settled
    assert read.non_retryable is None  # no decision: a field that release reads as False
    failure = stopped.model_copy(update={"status": JobStepStatus.COMPLETED_WITH_FAILURE})
    assert outcome_report(failure, 1, 1).decision == decided  # its own attempt's
    assert outcome_report(failure, 1, 2).decision is None
    assert outcome_report(stopped, 1, 1).decision is None  # a stop is decided by nothing


# -- the previous release to this one --------------------------------------------------------


def test_a_start_s_answer_from_a_previous_release_worker_is_decided_here(run, cluster, script):
    """An older worker answers a start of a step whose record holds its failure with that
    release's report: unpickled here, its `non_retryable` flag lands where the decision goes.
    The job reads it as no decision and decides the failure itself (the flag is the
    error's)."""

    async def older_worker(job_key, job_id, job_type, starts, sticky, step_types=None):
        dispatched = await real(job_key, job_id, job_type, [], sticky)
        for start in starts:
            older = PreviousStepReport(
                start.step_id,
                JobStepStatus.COMPLETED_WITH_FAILURE,
                start.generation,
                start.attempt,
                error=StepError(messages=["no"], non_retryable=True),
                non_retryable=True,
            )
            answer = StartResult(start.step_id, StartOutcome.COMPLETED, report=older)
            dispatched.results.append(across_from_previous_release(answer))
        return dispatched

    real = cluster.start_steps
    cluster.start_steps = older_worker

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert script.runs == []  # nothing ran here: the older worker answered
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 1


def test_a_failure_stored_by_the_previous_release_is_decided_once_on_resume(run, cluster, script):
    """That release stored a failed attempt without a decision: the job that resumes it
    decides it (here: retry after the backoff), stores the decision, and tries it again."""
    script.behaviour["a"].fail_times = 1

    async def scenario():
        result = await cluster.start(RetryingJob, request("a"))
        await cluster.settle()
        await cluster.crash()
        steps = cluster.storage().steps
        [stored] = await steps.get_for_job(result.job_id)
        await steps.save(stored.model_copy(update={"decision": None}))  # as that release wrote it
        await cluster.manager().resume(result.job_id)
        await cluster.settle()
        [decided] = await steps.get_for_job(result.job_id)
        await cluster.advance(1)
        return decided, await cluster.wait(result.job_id)

    decided, state = run(scenario())
    assert decided.decision is not None
    assert (decided.decision.attempt, decided.decision.retry) == (1, True)
    assert script.runs == [("a", 1), ("a", 2)]
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
