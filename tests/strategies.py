"""Hypothesis strategies for stored records, shared by the domain tests and the storage suite.

Every payload a strategy builds names one of the example types below and holds data that fits
that type, so a suite that calls `register_examples(registry)` can store, read and check the
records through the registry. Text avoids NUL and surrogates and integers stay within 2**53,
which every provider (SQLite, PostgreSQL JSON, MongoDB BSON) keeps exactly; datetimes are
timezone-aware UTC with microseconds.

    examples = register_examples(registry)

    @given(job_states(key=JobKey(scope="a"), registry_types=examples))
    def test_something(state): ...
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from hypothesis import strategies as st
from pydantic import BaseModel, Field

from choreography_ray.jobs import (
    JobKey,
    JobOwner,
    JobProgress,
    JobStageProgress,
    JobState,
    JobStatus,
    JobStepProgress,
    JobStepState,
    JobStepStatus,
    Payload,
    PlannedStep,
    Quarantine,
    StatusChange,
    StepError,
    StepLease,
    TypeKind,
    TypeRegistry,
)

# -- example types ------------------------------------------------------------------------------


class ExampleRequest(BaseModel):
    """What a job or a planned step is asked to do."""

    source: str
    shard: int
    tags: list[str] = Field(default_factory=list)


class ExampleStepState(BaseModel):
    """A step's checkpoint."""

    shard: int
    processed: int = 0
    cursor: str | None = None


class ExampleResult(BaseModel):
    """What a step produced (in full, or partially when it failed or stopped)."""

    rows: int
    notes: list[str] = Field(default_factory=list)


class ExampleJob:
    """Stands for a job class: the registry only needs a class to name."""


class ExampleStep:
    """Stands for a step class."""


@dataclass(frozen=True)
class Examples:
    """The registered names of the example types."""

    job_type: str = "tests.example-job"
    step_type: str = "tests.example-step"
    request_type: str = "tests.example-request"
    state_type: str = "tests.example-state"
    result_type: str = "tests.example-result"


EXAMPLES = Examples()


def register_examples(registry: TypeRegistry) -> Examples:
    """Register the example types in `registry` (again is harmless) and return their names."""
    registry.register(ExampleJob, kind=TypeKind.JOB, name=EXAMPLES.job_type)
    registry.register(ExampleStep, kind=TypeKind.STEP, name=EXAMPLES.step_type)
    registry.register(ExampleRequest, kind=TypeKind.REQUEST, name=EXAMPLES.request_type)
    registry.register(ExampleStepState, kind=TypeKind.STATE, name=EXAMPLES.state_type)
    registry.register(ExampleResult, kind=TypeKind.RESULT, name=EXAMPLES.result_type)
    return EXAMPLES


# -- building blocks ------------------------------------------------------------------------------

SAFE_INT = 2**53

_characters = st.characters(exclude_categories=("Cs", "Cc"), include_characters="\n\t")


def texts(min_size: int = 0, max_size: int = 20) -> st.SearchStrategy[str]:
    """Text every provider stores unchanged: no NUL, no lone surrogates."""
    return st.text(_characters, min_size=min_size, max_size=max_size)


def ids() -> st.SearchStrategy[str]:
    """Record ids: short, non-empty, printable."""
    return st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40)


def ints(min_value: int = -SAFE_INT, max_value: int = SAFE_INT) -> st.SearchStrategy[int]:
    return st.integers(min_value=min_value, max_value=max_value)


def utc_datetimes() -> st.SearchStrategy[datetime]:
    """Timezone-aware UTC datetimes with microseconds, within years 2000-2200."""
    return st.datetimes(
        min_value=datetime(2000, 1, 1),
        max_value=datetime(2200, 1, 1),
        timezones=st.just(UTC),
    )


def keys() -> st.SearchStrategy[JobKey]:
    names = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=30)
    return st.builds(JobKey, scope=names, namespace=names)


def request_payloads(types: Examples = EXAMPLES) -> st.SearchStrategy[Payload]:
    model = st.builds(
        ExampleRequest, source=texts(), shard=ints(), tags=st.lists(texts(), max_size=3)
    )
    return model.map(lambda m: Payload(type=types.request_type, data=m.model_dump(mode="json")))


def state_payloads(types: Examples = EXAMPLES) -> st.SearchStrategy[Payload]:
    model = st.builds(ExampleStepState, shard=ints(), processed=ints(0), cursor=st.none() | texts())
    return model.map(lambda m: Payload(type=types.state_type, data=m.model_dump(mode="json")))


def result_payloads(types: Examples = EXAMPLES) -> st.SearchStrategy[Payload]:
    model = st.builds(ExampleResult, rows=ints(0), notes=st.lists(texts(), max_size=3))
    return model.map(lambda m: Payload(type=types.result_type, data=m.model_dump(mode="json")))


def status_changes(statuses: st.SearchStrategy[int]) -> st.SearchStrategy[StatusChange]:
    return st.builds(
        StatusChange,
        status=statuses,
        occurred=utc_datetimes(),
        exception_messages=st.lists(texts(), max_size=3),
        exception_stack_trace=texts(max_size=80),
    )


@st.composite
def stage_progresses(draw: st.DrawFn, stage: int) -> JobStageProgress:
    total = draw(st.integers(0, 50))
    successful = draw(st.integers(0, total))
    failed = draw(st.integers(0, total - successful))
    unreachable = draw(st.integers(0, total - successful - failed))
    return JobStageProgress(
        stage=stage,
        is_started=draw(st.booleans()),
        total_steps=total,
        successful_steps=successful,
        failed_steps=failed,
        unreachable_steps=unreachable,
    )


@st.composite
def job_progresses(draw: st.DrawFn, *, staged: bool | None = None) -> JobProgress:
    """Progress whose counts add up, with zero or several stages (one stage is never recorded).

    `staged=True` always draws stages, `False` never; None draws either.
    """
    min_stages = 2 if staged else 0
    max_stages = 0 if staged is False else 4
    stage_numbers = draw(
        st.lists(st.integers(0, 20), unique=True, min_size=min_stages, max_size=max_stages)
    )
    stage_numbers = sorted(stage_numbers) if len(stage_numbers) > 1 else []
    stages = [draw(stage_progresses(n)) for n in stage_numbers]
    if stages:
        total = sum(s.total_steps for s in stages)
        successful = sum(s.successful_steps for s in stages)
        failed = sum(s.failed_steps for s in stages)
        unreachable = sum(s.unreachable_steps for s in stages)
    else:
        total = draw(st.integers(0, 1000))
        successful = draw(st.integers(0, total))
        failed = draw(st.integers(0, total - successful))
        unreachable = draw(st.integers(0, total - successful - failed))
    stopped = draw(st.integers(0, total - successful - failed - unreachable))
    return JobProgress(
        total_steps=total,
        successful_steps=successful,
        failed_steps=failed,
        stopped_steps=stopped,
        unreachable_steps=unreachable,
        stages=stages,
        message=draw(texts()),
    )


def planned_steps(types: Examples = EXAMPLES) -> st.SearchStrategy[PlannedStep]:
    return st.builds(
        PlannedStep,
        step_id=ids(),
        stage=st.integers(0, 20),
        step_type=st.just(types.step_type),
        name=texts(),
        request=request_payloads(types),
    )


def owners() -> st.SearchStrategy[JobOwner]:
    return st.builds(
        JobOwner,
        host=ids(),
        activation_epoch=st.integers(0, SAFE_INT),
        lease_expires=st.none() | utc_datetimes(),
    )


def quarantines() -> st.SearchStrategy[Quarantine]:
    return st.builds(
        Quarantine, reason=texts(), attempts=st.integers(1, 1000), since=utc_datetimes()
    )


def step_leases() -> st.SearchStrategy[StepLease]:
    return st.builds(StepLease, node=ids(), activation=ids(), heartbeat=utc_datetimes())


def step_errors(types: Examples = EXAMPLES) -> st.SearchStrategy[StepError]:
    return st.builds(
        StepError,
        messages=st.lists(texts(), max_size=3),
        stack_trace=texts(max_size=80),
        partial_result=st.none() | result_payloads(types),
        cancelled=st.booleans(),
    )


# -- records --------------------------------------------------------------------------------------


@st.composite
def job_states(
    draw: st.DrawFn,
    key: JobKey | None = None,
    registry_types: Examples = EXAMPLES,
    *,
    job_id: str | None = None,
    statuses: st.SearchStrategy[JobStatus] | None = None,
    versions: st.SearchStrategy[int] | None = None,
    populated: bool = False,
) -> JobState:
    """A `JobState` of the example job type in `key` (drawn when None).

    The current status is the last entry of the status history when there is one.
    `populated=True` fills every optional field (history, stages, request, plan, owner), as the
    round-trip test wants. `versions` defaults to 0, a record never saved.
    """
    status = draw(statuses if statuses is not None else st.sampled_from(JobStatus))
    history = draw(
        st.lists(
            status_changes(st.sampled_from(JobStatus).map(int)),
            min_size=1 if populated else 0,
            max_size=4,
        )
    )
    if history:
        last = history[-1].model_copy(update={"status": int(status)})
        history = [*history[:-1], last]
    progress = draw(job_progresses(staged=True if populated else None))

    def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
        return strategy if populated else st.none() | strategy

    return JobState(
        id=job_id if job_id is not None else draw(ids()),
        key=key if key is not None else draw(keys()),
        type=registry_types.job_type,
        details=draw(texts()),
        status=status,
        created=draw(utc_datetimes()),
        status_changes=history,
        progress=progress,
        request=draw(maybe(request_payloads(registry_types))),
        plan=draw(
            maybe(
                st.lists(
                    planned_steps(registry_types),
                    min_size=1 if populated else 0,
                    max_size=4,
                    unique_by=lambda p: p.step_id,
                )
            )
        ),
        has_stored_step_plan=draw(st.booleans()),
        stored_step_plan_incarnation=draw(maybe(st.integers(0, 1000))),
        stop_finalized=draw(st.booleans()),
        stopped_steps_counted=draw(st.lists(ids(), max_size=4, unique=True)),
        execution_generation=draw(st.integers(0, 1000)),
        pending_drain=draw(st.booleans()),
        owner=draw(maybe(owners())),
        recovery_attempts=draw(st.integers(0, 1000)),
        recovery_error=draw(texts()),
        quarantine=draw(maybe(quarantines())),
        version=draw(versions if versions is not None else st.just(0)),
    )


@st.composite
def job_step_states(
    draw: st.DrawFn,
    job_id: str | None = None,
    registry_types: Examples = EXAMPLES,
    *,
    step_id: str | None = None,
    statuses: st.SearchStrategy[JobStepStatus] | None = None,
    versions: st.SearchStrategy[int] | None = None,
    populated: bool = False,
) -> JobStepState:
    """A `JobStepState` of the example step type for `job_id` (drawn when None).

    Same conventions as `job_states`: the status ends the history, `populated=True` fills every
    optional field (history, lease, state, result, error with a partial result).
    """
    status = draw(statuses if statuses is not None else st.sampled_from(JobStepStatus))
    history = draw(
        st.lists(
            status_changes(st.sampled_from(JobStepStatus).map(int)),
            min_size=1 if populated else 0,
            max_size=4,
        )
    )
    if history:
        last = history[-1].model_copy(update={"status": int(status)})
        history = [*history[:-1], last]

    def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
        return strategy if populated else st.none() | strategy

    error = draw(maybe(step_errors(registry_types)))
    if populated and error.partial_result is None:
        error = error.model_copy(update={"partial_result": draw(result_payloads(registry_types))})
    return JobStepState(
        id=step_id if step_id is not None else draw(ids()),
        job_id=job_id if job_id is not None else draw(ids()),
        type=registry_types.step_type,
        name=draw(texts()),
        stage=draw(st.integers(0, 20)),
        status=status,
        status_changes=history,
        progress=draw(
            st.builds(
                JobStepProgress,
                percentage=st.floats(0, 100, allow_nan=False, allow_infinity=False),
                message=texts(),
            )
        ),
        is_prepared=draw(st.booleans()),
        attempt=draw(st.integers(1, 10)),
        lease=draw(maybe(step_leases())),
        generation=draw(st.integers(0, 1000)),
        state=draw(maybe(state_payloads(registry_types))),
        result=draw(maybe(result_payloads(registry_types))),
        error=error,
        version=draw(versions if versions is not None else st.just(0)),
    )
