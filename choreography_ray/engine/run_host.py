"""What a step run needs from the worker that hosts it, and the pieces they share: the run's
key, how synchronous work runs off the loop, what the worker counts.

A port, so that the run module never imports the worker: the worker imports runs, not the
other way round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

from pydantic import BaseModel

from ..jobs.errors import ChoreographyError
from ..jobs.options import JobsOptions
from ..jobs.registry import Payload, TypeRegistry
from ..jobs.state import JobKey
from ..jobs.status import JobStepStatus
from ..jobs.step import JobStep, StepContext
from .clock import Clock
from .messages import StepReport
from .writer import StepWriter


class StepMetrics:
    """What a worker counts; the Ray runtime sends it to Ray's metrics, tests ignore it."""

    def step_started(self) -> None:
        """A run began performing."""

    def step_finished(self, status: JobStepStatus, seconds: float) -> None:
        """A run's outcome is durable."""


class CallbackRejected(ChoreographyError):
    """Raised when step work calls back (checkpoint, progress) into a run that is over."""


class RunKey(NamedTuple):
    job_key: JobKey
    job_id: str
    step_id: str


class SyncRun(Protocol):
    """What a synchronous runner needs of the run it performs (`run.StepRun`)."""

    key: RunKey
    attempt: int

    @property
    def context(self) -> StepContext:
        """What the step's work is given."""

    cancel_work: Callable[[], None] | None
    """Set by a runner whose work runs elsewhere, to cancel it there."""


class SyncRunner(Protocol):
    """Runs a synchronous `perform` off the event loop: `SyncStepRunner` in threads here, a Ray
    task pinned to the host's node on Ray."""

    in_flight: int
    """Runs performing now."""

    async def run(
        self, step: JobStep[Any, Any, Any], state: BaseModel | None, run: SyncRun
    ) -> Any: ...

    def close(self) -> None:
        """The worker shuts down: nothing more is run."""


class SyncStepRunner:
    """Runs a synchronous `perform` off the event loop, in a thread."""

    def __init__(self, executor: Executor | None = None) -> None:
        self._executor = executor or ThreadPoolExecutor(thread_name_prefix="choreography-step")
        self.in_flight = 0

    async def run(self, step: JobStep[Any, Any, Any], state: BaseModel | None, run: SyncRun) -> Any:
        self.in_flight += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, step.perform, state, run.context
            )
        finally:
            self.in_flight -= 1

    def close(self) -> None:
        if isinstance(self._executor, ThreadPoolExecutor):
            self._executor.shutdown(wait=False, cancel_futures=True)


class RunHost(Protocol):
    """What a run needs from the worker that hosts it.

    A port, so that this module never imports the worker: the worker imports runs, not the
    other way round.
    """

    options: JobsOptions
    registry: TypeRegistry
    clock: Clock
    node_id: str
    activation_id: str
    host: str
    sync_runner: SyncRunner
    sync_slots: asyncio.Semaphore
    """Free CPUs for synchronous steps' work (`max_parallel_sync_steps`)."""
    metrics: StepMetrics
    closed: bool
    """The host shuts down: a run that settles afterwards writes and reports nothing."""

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn` on the worker's loop, from its thread or a step's thread."""

    def writer_for(self, key: JobKey) -> StepWriter:
        """The group commit of the run's partition."""

    def enqueue_report(self, key: RunKey, report: StepReport) -> None:
        """Send a durable outcome to the job, batched with others."""

    def slot_freed(self) -> None:
        """The run's work is over: its throttle slot goes to the next queued run."""

    def release(self, run: Any) -> None:
        """The run has ended: forget it."""


def call_on(loop: asyncio.AbstractEventLoop | None, fn: Callable[..., None], *args: Any) -> None:
    """Call `fn` on `loop`: at once from that loop (or before there is one), else from another
    thread (a synchronous step's), waiting for it to run there."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is None or running is loop:
        fn(*args)
        return
    asyncio.run_coroutine_threadsafe(_call(fn, *args), loop).result()


async def _call(fn: Callable[..., None], *args: Any) -> None:
    fn(*args)


def payload_tuple(payload: Payload | None) -> tuple[str, Any] | None:
    """A payload as (type name, JSON data): how results travel in reports."""
    return None if payload is None else (payload.type, payload.data)
