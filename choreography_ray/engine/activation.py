"""What every lifecycle operation of one job's activation shares, as one explicit object.

`ActivationCore` holds the job's record (`record.py`), its step ledger (`ledger.py`), the
retry rule, the author's job object and its hooks, the job's turn and its background tasks.
The operations (starting, stages, outcomes, stopping, resuming) are separate classes that take
the core and the operations they call; none reaches into another's attributes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ..jobs.errors import StartJobError
from ..jobs.job import Job, JobInfo, JobStepDispatchContext
from ..jobs.state import JobState
from .context import EngineContext, maybe_await
from .ledger import StepLedger
from .record import JobRecord
from .retrying import RetryRule

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


class ActivationCore:
    """The record, the ledger, the rule, the hooks, the turn and the tasks of one activation."""

    def __init__(
        self,
        ctx: EngineContext,
        job_class: type[Job[Any]],
        state: JobState,
        *,
        on_release: Callable[[], None],
        on_saved: Callable[[], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.job_class = job_class
        self.job = job_class()
        self.job.info = JobInfo(id=state.id, key=state.key, status=state.status)
        self.ledger = StepLedger()
        self.record = JobRecord(
            ctx, job_class, state, self.job.info, on_release=self._released, on_saved=on_saved
        )
        self.log = self.record.log
        self.counters = self.record.counters
        self.retry = RetryRule(self.job, ctx.options, ctx.registry, self.log)
        self.window = (
            state.max_active_steps
            or job_class.max_active_steps
            or ctx.options.max_active_steps_per_job
        )
        """The most steps tracked at once; None lets every step of a stage run."""
        self.hears_outcomes = (
            job_class.on_step_completed_or_stopped is not Job.on_step_completed_or_stopped
        )
        self.turn = asyncio.Lock()
        """Held by every operation and every batch of reports: one turn at a time."""
        self.background: set[asyncio.Task[Any]] = set()
        self._on_release = on_release

    @property
    def id(self) -> str:
        return self.record.state.id

    def _released(self) -> None:
        self.ledger.cancel_retries()
        self._on_release()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `coro` in the background; `cancel_background` ends it with the activation."""
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    def cancel_background(self) -> None:
        for task in list(self.background):
            task.cancel()

    async def hook(self, name: str, *args: Any) -> None:
        """Call the author's hook `name`, plain or async."""
        await maybe_await(getattr(self.job, name)(*args))

    async def dispatch_hook(
        self, *, incomplete: bool, resuming: bool, stage: int | None = None
    ) -> None:
        """`on_before_dispatching_job_steps` for `stage` (default: the first open one)."""
        if stage is None:
            stage = self.ledger.first_open_stage()
        await self.hook(
            "on_before_dispatching_job_steps",
            JobStepDispatchContext(
                initialization_may_be_incomplete=incomplete,
                resuming=resuming,
                stage=stage if stage is not None else 0,
            ),
        )
