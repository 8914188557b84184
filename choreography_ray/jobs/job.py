"""The author's side of a job: `Job`, its plan, its hooks and what it learns of its steps.

A job plans first: `prepare_steps` returns every step it will run, and the engine saves that
plan before preparing any step. Recovery reuses the saved plan and never calls
`prepare_steps` again, so steps keep their identities across crashes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from .concurrency import ConcurrencyKey
from .errors import TypeRegistryError
from .registry import TypeKind, TypeRegistry, default_registry
from .retry import RetryPolicy, check_policy
from .state import JobKey, JobProgress, StepError
from .status import JobStatus, JobStepStatus
from .step import JobStep, _generic_args, _model

TRequest = TypeVar("TRequest", bound=BaseModel)


class JobStageFailureBehavior(IntEnum):
    STOP_JOB = 0
    """A barrier: once the stage completes with failures, later stages never start."""
    CONTINUE_WITH_NEXT_STAGE = 1


@dataclass(frozen=True, slots=True, weakref_slot=True)
class StepDetails:
    """One planned step, as `create_step` makes it. Slotted: a job of a million steps holds a
    million of these until they are planned (88 bytes each rather than 120)."""

    step_id: str
    step_type: type[JobStep[Any, Any, Any]]
    request: BaseModel
    stage: int = 0
    name: str = ""


_SETTERS = tuple(
    StepDetails.__dict__[field].__set__
    for field in ("step_id", "step_type", "request", "stage", "name")
)


def planned_step(
    step_id: str,
    step_type: type[JobStep[Any, Any, Any]],
    request: BaseModel,
    stage: int,
    name: str,
) -> StepDetails:
    """A `StepDetails` of values already checked. A frozen dataclass's `__init__` sets each
    field through `object.__setattr__`; setting the slots directly takes 0.43 µs against its
    1.06, and a plan makes one per step."""
    details = object.__new__(StepDetails)
    set_id, set_type, set_request, set_stage, set_name = _SETTERS
    set_id(details, step_id)
    set_type(details, step_type)
    set_request(details, request)
    set_stage(details, stage)
    set_name(details, name)
    return details


_PLANNABLE: set[type] = set()
"""Step classes `create_step` has checked: a plan of thousands of steps has a handful."""


def _check_step_type(step_type: Any) -> None:
    if not (isinstance(step_type, type) and issubclass(step_type, JobStep)):
        if hasattr(step_type, "plan"):
            raise TypeRegistryError(
                f"{step_type!r} is a step function: plan its steps with .plan(item)"
            )
        raise TypeRegistryError(f"{step_type!r} is not a JobStep class")
    if not hasattr(step_type, "request_type"):
        raise TypeRegistryError(f"{step_type.__qualname__} does not declare its types")
    _PLANNABLE.add(step_type)


def check_stage(stage: Any) -> int:
    """A step's stage, refused unless a whole number from 0 (a bool is not one)."""
    if stage.__class__ is int and stage >= 0:  # the usual case, in one test
        return stage
    if not isinstance(stage, int) or isinstance(stage, bool) or stage < 0:
        raise ValueError(f"stage must be a whole number >= 0, got {stage!r}")
    return stage


class _OrderedIds:
    """Time-ordered step ids: UUID version 7 in hex (milliseconds since the epoch; a 30-bit
    counter that starts at random each millisecond and counts up within it; 44 random bits),
    increasing within a process, from one read of the system's randomness per 1,024 ids.

    Ordered because a step id is the key of the steps table: random keys put each of a
    million inserted rows on a page of its own in the primary key's index, and every batch of
    a thousand wrote about a thousand index pages (docs/decisions.md, "Step ids are ordered
    by time"). The random bits keep ids of different processes apart."""

    _BATCH = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: list[int] = []
        self._last = 0
        self._seq = 0
        self._top = 0
        """The current millisecond's bits of the id, with the version and the variant."""

    def __call__(self) -> str:
        with self._lock:
            if not self._pool:
                data = os.urandom(10 * self._BATCH)
                self._pool = [
                    int.from_bytes(data[i : i + 10], "big") for i in range(0, len(data), 10)
                ]
            bits = self._pool.pop()
            ms = time.time_ns() // 1_000_000
            if ms > self._last:
                self._last, self._seq = ms, bits & 0x1FFFFFFF
                self._top = ms << 80 | _VERSION_AND_VARIANT
            else:
                self._seq += 1
                if self._seq >= 1 << 30:
                    self._last, self._seq = self._last + 1, 0
                    self._top = self._last << 80 | _VERSION_AND_VARIANT
            top, seq = self._top, self._seq
        # `to_bytes(16).hex()` rather than formatting the number: a third of a microsecond of
        # the 1.6 an id took, and a plan makes one per step.
        value = top | (seq >> 18) << 64 | (seq & 0x3FFFF) << 44 | (bits >> 36) & _RANDOM_44
        return value.to_bytes(16).hex()


_VERSION_AND_VARIANT = 7 << 76 | 0b10 << 62
_RANDOM_44 = (1 << 44) - 1


new_step_id = _OrderedIds()
"""A new step identity (a version-7 UUID in hex: time-ordered, with random bits)."""

new_job_id = _OrderedIds()
"""A new job identity, ordered by time as step ids are: a job's id leads every key of its
step records, so a new job's rows go after the other jobs' in each index, not among them."""


@dataclass(frozen=True)
class JobStepDispatchContext:
    """Told to `on_before_dispatching_job_steps`.

    `initialization_may_be_incomplete` is True when recovery found the job still preparing or
    starting its steps: the start hook may not have run or finished.
    """

    initialization_may_be_incomplete: bool
    resuming: bool
    stage: int


@dataclass(frozen=True)
class StepOutcome:
    """What a job learns of one step's end: its status, its result or its error."""

    step_id: str
    name: str
    stage: int
    status: JobStepStatus
    attempt: int = 1
    result: Any = None
    """The step's result (or partial result of a stop or failure), typed as the step declares."""
    error: StepError | None = None

    @property
    def succeeded(self) -> bool:
        return self.status == JobStepStatus.COMPLETED_SUCCESSFULLY

    @property
    def stopped(self) -> bool:
        return self.status == JobStepStatus.STOPPED


@dataclass
class JobInfo:
    """The job's identity and progress, as its hooks may read them."""

    id: str
    key: JobKey
    status: JobStatus
    progress: JobProgress = field(default_factory=JobProgress)


class Job(Generic[TRequest]):
    """A job. Subclass with a concrete request type and implement `prepare_steps`:

        class RebuildIndex(Job[RebuildIndexRequest], name="rebuild-index"):
            def prepare_steps(self, request):
                return [self.create_step(RebuildShard, ShardRequest(shard=s))
                        for s in request.shards]

    Every hook may be a plain or an `async` method. Hooks can run again after a crash, so they
    must tolerate running twice.
    """

    name: ClassVar[str]
    request_type: ClassVar[type[BaseModel]]
    registry: ClassVar[TypeRegistry]

    keep_after_completed: ClassVar[bool] = False
    """Keep the job and its steps in storage after it completes successfully."""
    keep_after_completed_with_failures: ClassVar[bool] = True
    start_steps_in_background: ClassVar[bool] = False
    """Start returns once the job and its plan are durable; steps come up behind it."""
    max_active_steps: ClassVar[int | None] = None
    """A sliding window of active steps; None uses the options (off by default)."""
    max_step_attempts: ClassVar[int | None] = None
    """Attempts per step; None uses `JobsOptions.max_step_attempts` (1). A shorthand for a
    `retry_policy` with the options' backoff."""
    retry_policy: ClassVar[RetryPolicy | None] = None
    """How the job's steps' failures are retried, unless a step class sets its own; None uses
    the options (`max_step_attempts`, `step_retry_backoff`, `max_step_retry_backoff`)."""
    can_resume: ClassVar[bool] = True
    priority: ClassVar[int] = 0
    """The priority of a job started without one (higher goes first; docs/scheduling.md)."""
    concurrency: ClassVar[ConcurrencyKey | None] = None
    """At most `max_running` jobs of one key run at once across the cluster; the others wait
    (docs/scheduling.md)."""

    info: JobInfo
    """Set by the engine before any hook runs."""

    def __init_subclass__(
        cls, *, name: str | None = None, registry: TypeRegistry | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        args = _generic_args(cls, Job)
        if args is None:
            return
        if len(args) != 1:
            raise TypeRegistryError(f"{cls.__qualname__}: a job has exactly one request type")
        cls.registry = registry or default_registry
        cls.name = name or f"{cls.__module__}.{cls.__qualname__}"
        cls.request_type = _model(args[0], "request", cls)
        cls.registry.register(cls.request_type, kind=TypeKind.REQUEST)
        cls.registry.register(cls, kind=TypeKind.JOB, name=cls.name)
        check_policy(cls)
        if cls.concurrency is not None:
            cls.concurrency.check(cls.request_type, cls.__qualname__)

    # -- planning ---------------------------------------------------------------------------

    def prepare_steps(
        self, request: TRequest
    ) -> Iterable[StepDetails] | Awaitable[Iterable[StepDetails]]:
        """Every step the job will run. Called once per job, before any step exists."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement prepare_steps")

    def create_step(
        self,
        step_type: type[JobStep[Any, Any, Any]],
        request: BaseModel,
        *,
        stage: int = 0,
        name: str = "",
        step_id: str | None = None,
    ) -> StepDetails:
        """Plan one step: a new identity, its stage (0 first), its type and its request."""
        try:
            known = step_type in _PLANNABLE
        except TypeError:  # unhashable: no class at all
            known = False
        if not known:
            _check_step_type(step_type)
        if not isinstance(request, step_type.request_type):
            raise TypeError(
                f"{step_type.__qualname__} takes a {step_type.request_type.__qualname__} "
                f"request, got {type(request).__qualname__}"
            )
        return planned_step(step_id or new_step_id(), step_type, request, check_stage(stage), name)

    def details(self, request: TRequest) -> str:
        """A line that says what this job does, for listings."""
        return ""

    def failure_behavior_for(self, stage: int) -> JobStageFailureBehavior:
        return JobStageFailureBehavior.STOP_JOB

    def should_retry_step(self, step: StepOutcome, error: StepError) -> bool:
        """Whether a failed attempt is tried again while attempts remain."""
        return True

    # -- hooks ------------------------------------------------------------------------------

    def on_before_starting_job_steps(self) -> Awaitable[None] | None:
        """Once, on a clean start, after the steps are prepared and before any is dispatched."""

    def on_before_resuming_job_steps(self) -> Awaitable[None] | None:
        """On resume, after Running is written and before steps are dispatched again."""

    def on_before_dispatching_job_steps(
        self, context: JobStepDispatchContext
    ) -> Awaitable[None] | None:
        """Before a stage's steps are dispatched, on start and on resume. Make it idempotent."""

    def on_step_completed_or_stopped(self, outcome: StepOutcome) -> Awaitable[None] | None:
        """After each step's outcome is counted. May run again after a crash, or not at all."""

    def on_all_steps_completed(self) -> Awaitable[None] | None:
        """Once every step has an outcome; raising fails the job."""

    def on_failed_to_prepare(self) -> Awaitable[None] | None:
        """After a step failed to prepare; the job is Failed."""

    def get_active_hosts(self, hosts: frozenset[str]) -> frozenset[str] | Awaitable[frozenset[str]]:
        """The worker hosts this job's watchdog takes as alive; `hosts` is what the cluster
        says. Override to read membership another way. With leases on, a step is restarted
        only when the host in its lease is not in this set and its lease has expired."""
        return hosts

    def on_stopped(self) -> Awaitable[None] | None:
        """After every running step stopped, on stop and on removal."""
