"""The shared core of a job's activation: its state, its turn, its writes and its hooks.

The lifecycle itself is split by phase into mixins (starting, stages, outcomes, stopping,
resuming) that `JobActivation` in job.py puts together."""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ..jobs.errors import (
    StartJobError,
    VersionConflictError,
)
from ..jobs.job import Job, JobInfo, JobStepDispatchContext
from ..jobs.state import JobState, JobStepState, PlannedStep, StatusChange
from ..jobs.status import (
    JobStatus,
)
from .context import EngineContext, error_messages, maybe_await
from .messages import StepReport

log = logging.getLogger("choreography_ray.engine")

PREPARE_BATCH = 1000
DISPATCH_BATCH = 1000


@dataclass(frozen=True)
class JobStartResult:
    """How a start went. `error` is None on success; NO_JOB_STEPS_TO_START is not a failure."""

    job_id: str
    error: StartJobError | None = None
    reason: str = ""
    failed_steps: tuple[str, ...] = ()

    @property
    def succeeded(self) -> bool:
        return self.error in (None, StartJobError.NO_JOB_STEPS_TO_START)


@dataclass
class _Tracked:
    stage: int
    attempt: int
    generation: int


@dataclass
class _Counters:
    reports: int = 0
    ignored_reports: int = 0
    dispatched: int = 0
    job_writes: int = 0
    step_batches: int = 0
    step_rows: int = 0
    hook_errors: list[str] = field(default_factory=list)


class Released(Exception):
    """The activation can no longer trust its copy of the job and has let it go."""


class ActivationBase:
    """State and plumbing every part of a job's activation shares."""

    def __init__(
        self,
        ctx: EngineContext,
        job_class: type[Job[Any]],
        state: JobState,
        *,
        on_release: Any = None,
        on_saved: Callable[[], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self._on_saved = on_saved
        self.job_class = job_class
        self.state = state
        self.job = job_class()
        self.job.info = JobInfo(id=state.id, key=state.key, status=state.status)
        self._on_release = on_release
        self._hears_outcomes = (
            job_class.on_step_completed_or_stopped is not Job.on_step_completed_or_stopped
        )
        self.log = logging.LoggerAdapter(log, {"job_id": state.id, "step_id": "-"})
        self._turn = asyncio.Lock()
        self._inbox: list[StepReport] = []
        self._drain_task: asyncio.Task[None] | None = None
        self._stage_steps: dict[int, list[str]] = {}
        self._stage_of: dict[str, int] = {}
        self._names: dict[str, str] = {}
        self._tracked: dict[str, _Tracked] = {}
        self._waiting: deque[tuple[str, int]] = deque()
        self._counted: set[str] = set()
        self._next_attempt: dict[str, int] = {}
        self._originals: dict[str, BaseModel] = {}
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._current_stage: int | None = None
        self._loaded = False
        self.released = False
        self.release_reason = ""
        """Why the activation let go of the job; empty when it finished normally."""
        self.counters = _Counters()
        self._background: set[asyncio.Task[Any]] = set()

    # -- small helpers ------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self.state.id

    @property
    def _window(self) -> int | None:
        return self.job_class.max_active_steps or self.ctx.options.max_active_steps_per_job

    @property
    def _max_attempts(self) -> int:
        return self.job_class.max_step_attempts or self.ctx.options.max_step_attempts

    def _change(self, status: JobStatus, error: BaseException | str | None = None) -> None:
        messages: list[str] = []
        trace = ""
        if isinstance(error, BaseException):
            messages = error_messages(error)
            trace = "".join(traceback.format_exception(error))
        elif error:
            messages = [error]
        self.state.status = status
        self.state.status_changes = [
            *self.state.status_changes,
            StatusChange(
                status=int(status),
                occurred=self.ctx.clock.now(),
                exception_messages=messages,
                exception_stack_trace=trace,
            ),
        ]
        self.job.info.status = status
        self.job.info.progress = self.state.progress
        if self.ctx.on_status is not None:
            self.ctx.on_status(status)

    async def _save(self) -> None:
        """Compare-and-set the job record; a lost race means another activation owns the job."""
        try:
            self.state.version = await self.ctx.storage.jobs.save(self.state)
        except VersionConflictError:
            self._release("the job changed in storage under this activation")
            raise
        self.counters.job_writes += 1
        if self._on_saved is not None:
            self._on_saved()

    def _release(self, reason: str) -> None:
        if not self.released:
            self.log.warning("job %s: activation released: %s", self.id, reason)
            self.released = True
            self.release_reason = reason
            for task in self._retries.values():
                task.cancel()
            if self._on_release is not None:
                self._on_release(self)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _hook(self, name: str, *args: Any) -> None:
        await maybe_await(getattr(self.job, name)(*args))

    async def _dispatch_hook(
        self, *, incomplete: bool, resuming: bool, stage: int | None = None
    ) -> None:
        """`on_before_dispatching_job_steps` for `stage` (default: the first open one)."""
        if stage is None:
            stage = self._first_open_stage()
        await self._hook(
            "on_before_dispatching_job_steps",
            JobStepDispatchContext(
                initialization_may_be_incomplete=incomplete,
                resuming=resuming,
                stage=stage if stage is not None else 0,
            ),
        )

    # -- watching ---------------------------------------------------------------------------

    async def snapshot(self) -> JobState:
        async with self._turn:
            return self.state.model_copy(deep=True)

    @property
    def busy(self) -> bool:
        """Outcomes queued or being counted (timers waiting on the clock do not count)."""
        return bool(self._inbox) or (self._drain_task is not None and not self._drain_task.done())


async def _save_all(storage: Any, states: list[JobStepState]) -> None:
    """Save step records the job changes (Unreachable), re-reading any that moved meanwhile."""
    try:
        versions = await storage.save_many(states)
    except VersionConflictError as conflict:
        lost = set(conflict.conflicts)
        rest = [s for s in states if s.id not in lost]
        if rest:
            await _save_all(storage, rest)
        return
    for state, version in zip(states, versions, strict=True):
        state.version = version


def _stage_sizes(plan: Iterable[PlannedStep]) -> dict[int, int]:
    sizes: dict[int, int] = {}
    for step in plan:
        sizes[step.stage] = sizes.get(step.stage, 0) + 1
    return sizes
