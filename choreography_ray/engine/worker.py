"""The worker: runs step activations, a node's throttle, group-committed outcomes, batched reports.

A worker receives starts in batches, loads the steps' records in one read, and queues runs.
At most `max_parallel_steps` runs perform at once. Each run writes Running, performs, and
writes its outcome through the group-committing `StepWriter`; only once the outcome is durable
is it reported to the job, in batches per job. A run whose record changed under it (a stale
run) stops and reports nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from datetime import timedelta
from typing import Any, NamedTuple

from pydantic import BaseModel

from ..jobs.errors import ActivationCallbackRejected, ChoreographyError, StartJobStepError
from ..jobs.options import JobsOptions
from ..jobs.registry import Payload, TypeKind, TypeRegistry, trusted
from ..jobs.state import (
    JobKey,
    JobStepProgress,
    JobStepState,
    StatusChange,
    StepError,
    StepLease,
)
from ..jobs.status import JobStepStatus
from ..jobs.step import JobStep, StepCancelled, StepContext, StepFailed
from ..storage.protocols import JobsStorage
from .clock import Clock
from .messages import (
    StartOutcome,
    StartResult,
    StepReport,
    StepStart,
    StopRequest,
    StopResult,
)
from .ports import JobReporter
from .writer import StaleRecord, StepWriter, Tracked

log = logging.getLogger("choreography_ray.engine")


_DONE = JobStepProgress(percentage=100.0, message="")

_MAX_DELIVERIES = 8
"""Report sends in flight at once, per worker."""


class StepMetrics:
    """What a worker counts; the Ray runtime sends it to Ray's metrics, tests ignore it."""

    def step_started(self) -> None:
        """A run began performing."""

    def step_finished(self, status: JobStepStatus, seconds: float) -> None:
        """A run's outcome is durable."""


class CallbackRejected(ChoreographyError):
    """Raised when step work calls back (checkpoint, progress) into a run that is over."""


class SyncStepRunner:
    """Runs a synchronous `perform` off the event loop: a thread here, a Ray task on Ray."""

    def __init__(self, executor: Executor | None = None) -> None:
        self._executor = executor or ThreadPoolExecutor(thread_name_prefix="choreography-step")
        self.in_flight = 0

    async def run(self, step: JobStep[Any, Any, Any], state: BaseModel, ctx: StepContext) -> Any:
        self.in_flight += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, step.perform, state, ctx
            )
        finally:
            self.in_flight -= 1

    def close(self) -> None:
        if isinstance(self._executor, ThreadPoolExecutor):
            self._executor.shutdown(wait=False, cancel_futures=True)


class RunKey(NamedTuple):
    job_key: JobKey
    job_id: str
    step_id: str


class StepRun(StepContext):
    """One run of one step, and the context its work sees."""

    def __init__(
        self,
        worker: StepWorker,
        key: RunKey,
        record: Tracked,
        step_class: type[JobStep[Any, Any, Any]],
        start: StepStart,
    ) -> None:
        self.worker = worker
        self.key = key
        self.record = record
        self.step_class = step_class
        self.job_id = key.job_id
        self.step_id = key.step_id
        self.attempt = start.attempt
        self.generation = start.generation
        self.closed = False
        self._cancelled = False
        self._cancel: asyncio.Event | None = None
        self._removing = False
        self.runner: asyncio.Task[Any] | None = None
        """The task performing this run's async work, while it performs (to cancel it)."""
        self._user_state: BaseModel | None = None
        self._checkpoints = 0
        self._unwritten = False
        self._started: float | None = None
        self.holds_slot = False
        self.cancel_work: Callable[[], None] | None = None
        """Set by a runner whose work runs elsewhere, to cancel it there."""
        self._flush_timer: asyncio.Task[None] | None = None
        self._done: asyncio.Future[None] | None = None
        self._ended = False
        self._report: StepReport | None = None

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger that stamps the job and step ids (made when first needed)."""
        return logging.LoggerAdapter(log, {"job_id": self.job_id, "step_id": self.step_id})

    @property
    def done(self) -> asyncio.Future[None]:
        """Resolves when the run has ended (made when first needed)."""
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
            if self._ended:
                self._done.set_result(None)
        return self._done

    # -- the context the work sees --------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise CallbackRejected(
                f"step {self.step_id} of job {self.job_id}: the run is over",
                code=ActivationCallbackRejected.CLOSED,
            )

    def checkpoint(self, state: BaseModel | None = None) -> None:
        self.worker.call_soon(self._checkpoint, state)

    def _checkpoint(self, state: BaseModel | None) -> None:
        self._check_open()
        if state is not None:
            self._user_state = state
        if self._user_state is None:
            return
        options = self.worker.options
        self._set(state=self.worker.registry.dump(self._user_state))
        self._checkpoints += 1
        every = (
            1
            if self.step_class.checkpoint_after_every_batch
            else (options.step_checkpoint_batch_interval)
        )
        if self._checkpoints % every == 0:
            self._unwritten = False
            self._write_later()
            return
        self._unwritten = True
        if options.step_checkpoint_flush_interval > timedelta(0) and (
            self._flush_timer is None or self._flush_timer.done()
        ):
            self._flush_timer = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await self.worker.clock.sleep(
            self.worker.options.step_checkpoint_flush_interval.total_seconds()
        )
        if not self.closed and self._unwritten:
            self._unwritten = False
            self._write_later()

    def progress(self, percentage: float, message: str = "") -> None:
        self.worker.call_soon(self._progress, percentage, message)

    def _progress(self, percentage: float, message: str) -> None:
        self._check_open()
        self._set(progress=JobStepProgress(percentage=float(percentage), message=message))

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    async def wait_cancelled(self) -> None:
        if self._cancelled:
            return
        if self._cancel is None:
            self._cancel = asyncio.Event()
        await self._cancel.wait()

    def now(self):  # type: ignore[no-untyped-def]
        return self.worker.clock.now()

    # -- the run ----------------------------------------------------------------------------

    def _set(self, **changes: Any) -> None:
        """Replace fields, never mutate them: a flush may be copying the record meanwhile.

        Written straight into the record's fields: every value here is already valid, and
        pydantic's attribute hook costs more than the rest of a no-op step."""
        self.record.state.__dict__.update(changes)

    def _status(self, status: JobStepStatus, error: StepError | None = None) -> None:
        change = trusted(
            StatusChange,
            status=int(status),
            occurred=self.worker.clock.now(),
            exception_messages=list(error.messages) if error else [],
            exception_stack_trace=error.stack_trace if error else "",
        )
        self._set(status=status, status_changes=[*self.record.state.status_changes, change])

    def _write(self) -> asyncio.Future[None]:
        return self.worker.writer_for(self.key.job_key).write(self.record)

    def _write_later(self) -> None:
        """Checkpoints and Running: the outcome's write, waited for, comes after them."""
        self.worker.writer_for(self.key.job_key).write_later(self.record)

    def cancel(self, removing: bool) -> None:
        self._removing = self._removing or removing
        self._cancelled = True
        if self._cancel is not None:
            self._cancel.set()
        if self.closed:
            return  # settling: its outcome is being written and will be reported
        if self.cancel_work is not None:
            self.cancel_work()
        if self.runner is not None and not self.runner.done():
            self.runner.cancel()  # set only while async work performs, so it lands there

    async def execute(self) -> None:
        """Perform, then settle. The outcome's write completes later, in `_written`: the task
        that performed moves on to the next run at once."""
        written = None
        try:
            written = await self._execute()
        except Exception:
            self.log.exception(
                "run of step %s of job %s failed to settle", self.step_id, self.job_id
            )
        finally:
            if written is None:
                self._end()
        if written is not None:
            written.add_done_callback(self._written)

    def _written(self, write: asyncio.Future[None]) -> None:
        report, self._report = self._report, None
        try:
            write.result()
        except StaleRecord:
            self.log.info("stale run of step %s of job %s ended", self.step_id, self.job_id)
        except BaseException as error:
            self.log.error(
                "the outcome of step %s of job %s was not written: %s; the job recounts it "
                "from storage",
                self.step_id,
                self.job_id,
                error,
            )
        else:
            if self._started is not None:
                self.worker.metrics.step_finished(
                    report.status, time.perf_counter() - self._started
                )
            self.worker.enqueue_report(self.key, report)
        self._end()

    def _end(self) -> None:
        self.closed = True
        if self._flush_timer is not None:
            self._flush_timer.cancel()
        self.worker.release(self)
        self._ended = True
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    async def _execute(self) -> asyncio.Future[None] | None:
        registry = self.worker.registry
        step = self.step_class()
        stored = self.record.state
        user_state = registry.load(stored.state, TypeKind.STATE) if stored.state else None
        self._user_state = user_state
        if self.cancelled:
            return self._settle_stopped(step)
        lease = None
        if self.worker.options.step_lease_timeout > timedelta(0):
            lease = StepLease(
                node=self.worker.node_id,
                activation=self.worker.activation_id,
                heartbeat=self.worker.clock.now(),
            )
        self._set(attempt=self.attempt, generation=self.generation, lease=lease, error=None)
        self._status(JobStepStatus.RUNNING)
        self._write_later()  # the outcome's write follows it in order, and is waited for
        self._started = time.perf_counter()
        self.worker.metrics.step_started()
        try:
            if self.step_class.is_async():
                self.runner = asyncio.current_task()
                try:
                    result = await step.perform(self._user_state, self)
                finally:
                    self.runner = None
            else:
                result = await self.worker.sync_runner.run(step, self._user_state, self)
        except (asyncio.CancelledError, StepCancelled):
            if not self.cancelled:
                raise
            return self._settle_stopped(step)
        except StepFailed as failure:
            partial = step.wrap_result(failure.partial_result) if failure.partial_result else None
            error = StepError(
                messages=failure.messages,
                stack_trace=traceback.format_exc(),
                partial_result=registry.dump(partial) if partial is not None else None,
                non_retryable=failure.non_retryable,
            )
            return self._settle(JobStepStatus.COMPLETED_WITH_FAILURE, error=error)
        except Exception as failure:
            if self.cancelled and isinstance(failure, CallbackRejected):
                return self._settle_stopped(step)
            error = StepError(
                messages=[f"{type(failure).__name__}: {failure}"],
                stack_trace=traceback.format_exc(),
            )
            return self._settle(JobStepStatus.COMPLETED_WITH_FAILURE, error=error)
        wrapped = step.wrap_result(result)
        return self._settle(
            JobStepStatus.COMPLETED_SUCCESSFULLY,
            result=registry.dump(wrapped) if wrapped is not None else None,
        )

    def _settle_stopped(self, step: JobStep[Any, Any, Any]) -> asyncio.Future[None]:
        partial = None
        if self._user_state is not None:
            try:
                partial = step.wrap_result(
                    step.create_cancelled_result_from_current_state(self._user_state)
                )
            except Exception:
                self.log.exception("create_cancelled_result_from_current_state failed")
        error = StepError(
            messages=["stopped"],
            cancelled=True,
            partial_result=self.worker.registry.dump(partial) if partial is not None else None,
        )
        status = JobStepStatus.REMOVING if self._removing else JobStepStatus.STOPPED
        return self._settle(status, error=error)

    def release_slot(self) -> None:
        """The work is over: its throttle slot goes to the next run at once, while this run's
        outcome is still being written (the throttle bounds performing, not persisting)."""
        if self.holds_slot:
            self.holds_slot = False
            self.worker._slot_done()

    def _settle(
        self, status: JobStepStatus, *, result: Any = None, error: StepError | None = None
    ) -> asyncio.Future[None]:
        """Write the outcome; `_written` reports it once durable, so nothing is counted
        unsaved."""
        self.closed = True
        self.release_slot()
        if self._user_state is not None:
            self._set(state=self.worker.registry.dump(self._user_state))
        self._set(result=result, error=error, lease=None)
        if status == JobStepStatus.COMPLETED_SUCCESSFULLY:
            self._set(progress=_DONE)
        self._status(status, error)
        stored = self.record.state
        self._report = StepReport(
            step_id=stored.id,
            status=status,
            generation=self.generation,
            attempt=self.attempt,
            stage=stored.stage,
            name=stored.name,
            result=_plain(
                result if result is not None else (error.partial_result if error else None)
            ),
            error=error,
            non_retryable=bool(error and error.non_retryable),
        )
        return self._write()


class StepWorker:
    """Runs steps for every job that dispatches to it; one per worker node."""

    def __init__(
        self,
        *,
        storage_for: Callable[[JobKey], JobsStorage],
        registry: TypeRegistry,
        options: JobsOptions,
        clock: Clock,
        reporter: JobReporter,
        max_parallel_steps: int | None = None,
        sync_runner: SyncStepRunner | None = None,
        node_id: str = "local",
        activation_id: str = "local",
    ) -> None:
        self.storage_for = storage_for
        self.registry = registry
        self.options = options
        self.clock = clock
        self.reporter = reporter
        self.max_parallel_steps = max_parallel_steps or options.effective_max_parallel_steps
        self.sync_runner = sync_runner or SyncStepRunner()
        self.node_id = node_id
        self.activation_id = activation_id
        self._runs: dict[RunKey, StepRun] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._queue: deque[StepRun] = deque()
        self._performing = 0
        self._runners = 0
        self._writers: dict[JobKey, StepWriter] = {}
        self._reports: dict[tuple[JobKey, str], list[StepReport]] = {}
        self._report_task: asyncio.Task[None] | None = None
        self._deliveries: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.peak_parallel = 0
        self.closed = False
        self.metrics = StepMetrics()

    # -- plumbing ---------------------------------------------------------------------------

    def writer_for(self, key: JobKey) -> StepWriter:
        writer = self._writers.get(key)
        if writer is None:
            writer = self._writers[key] = StepWriter(key, self.storage_for(key))
        return writer

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        """Run a context callback on the worker's loop, from its thread or a step's thread."""
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            fn(*args)
            return
        future = asyncio.run_coroutine_threadsafe(_call(fn, *args), loop)
        future.result()

    def callback(self, job_key: JobKey, job_id: str, step_id: str, kind: str, value: Any) -> bool:
        """A call from step work running elsewhere (a Ray task): checkpoint, progress, or
        whether the run was asked to stop. Refused (`CallbackRejected`) once the run is over."""
        run = self._runs.get(RunKey(job_key, job_id, step_id))
        if run is None or run.closed:
            why = ActivationCallbackRejected.CLOSED if run else ActivationCallbackRejected.NO_RUN
            raise CallbackRejected(f"step {step_id} of job {job_id}: the run is over", code=why)
        if kind == "checkpoint":
            run._checkpoint(value)
        elif kind == "progress":
            run._progress(*value)
        return run.cancelled

    def write_stats(self) -> dict[str, int]:
        """Step records this worker wrote, and in how many batches."""
        return {
            "step_batches": sum(w.flushes for w in self._writers.values()),
            "step_rows": sum(w.records_written for w in self._writers.values()),
        }

    @property
    def active_runs(self) -> int:
        return len(self._runs)

    @property
    def busy(self) -> bool:
        """Work that moves on by itself: runs waiting for a free slot, synchronous steps in
        threads, outcomes being written, or reports being sent. Async runs that wait on
        something else do not count."""
        return bool(
            (self._queue and self._performing < self.max_parallel_steps)
            or self.sync_runner.in_flight
            or self._reports
            or (self._report_task is not None and not self._report_task.done())
            or self._deliveries
            or any(w.busy for w in self._writers.values())
        )

    def runs_of(self, job_id: str) -> list[StepRun]:
        return [run for key, run in self._runs.items() if key.job_id == job_id]

    # -- starting -------------------------------------------------------------------------

    async def start_steps(
        self, job_key: JobKey, job_id: str, job_type: str, starts: Sequence[StepStart]
    ) -> list[StartResult]:
        self._loop = asyncio.get_running_loop()
        if self.closed:
            return [_failed(s.step_id, "the worker is shutting down") for s in starts]
        storage = self.storage_for(job_key)
        stored = {
            state.id: state
            for state in await storage.steps.get_many(job_id, [s.step_id for s in starts])
        }
        results = []
        for start in starts:
            results.append(self._start_one(job_key, job_id, start, stored.get(start.step_id)))
        self._pump()
        return results

    def _start_one(
        self, job_key: JobKey, job_id: str, start: StepStart, state: JobStepState | None
    ) -> StartResult:
        key = RunKey(job_key, job_id, start.step_id)
        if state is None or not state.is_prepared:
            return StartResult(
                start.step_id,
                StartOutcome.FAILED,
                StartJobStepError.NOT_PREPARED,
                "the step has no prepared record",
            )
        existing = self._runs.get(key)
        if existing is not None:
            if existing.generation >= start.generation and existing.attempt >= start.attempt:
                return StartResult(start.step_id, StartOutcome.ALREADY_STARTED)
            existing.cancel(removing=False)  # an older run: it reports its stop, then ends
        finished = _finished_report(state)
        if finished is not None:
            retry = state.status == JobStepStatus.COMPLETED_WITH_FAILURE and (
                start.attempt > state.attempt
            )
            if not retry:
                return StartResult(start.step_id, StartOutcome.COMPLETED, report=finished)
        if state.status == JobStepStatus.FAILED:
            return StartResult(
                start.step_id,
                StartOutcome.FAILED,
                StartJobStepError.UNRECOVERABLE_FAILED_STATE,
                "the step failed unrecoverably",
            )
        try:
            step_class = self.registry.resolve(state.type, TypeKind.STEP)
        except ChoreographyError as error:
            return StartResult(
                start.step_id, StartOutcome.FAILED, StartJobStepError.UNKNOWN, str(error)
            )
        record = Tracked(state)
        run = StepRun(self, key, record, step_class, start)
        if existing is not None:
            # One run per step: the new one waits for the old one to report its stop.
            previous = existing.done
            self._runs[key] = run
            self._spawn(self._after(previous, run))
        else:
            self._runs[key] = run
            self._queue.append(run)
        return StartResult(start.step_id, StartOutcome.STARTED)

    async def _after(self, previous: asyncio.Future[None], run: StepRun) -> None:
        await asyncio.shield(previous)
        if self._runs.get(run.key) is run and not self.closed:
            self._queue.append(run)
            self._pump()

    def _pump(self) -> None:
        """Add runners while runs wait and slots are free; each runner takes run after run
        from the queue, so a task is made per slot, not per run."""
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        while (
            self._runners - self._performing < len(self._queue)  # runners yet to take a run
            and self._runners < self.max_parallel_steps
        ):
            self._runners += 1
            self._spawn(self._runner(), loop)

    async def _runner(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            while self._queue and not self.closed and self._performing < self.max_parallel_steps:
                run = self._queue.popleft()
                run.holds_slot = True
                self._performing += 1
                self.peak_parallel = max(self.peak_parallel, self._performing)
                try:
                    await run.execute()
                finally:
                    run.release_slot()
                while task.cancelling():  # a stop that landed in the run's work, handled
                    task.uncancel()
                # Work that never waits (a no-op step) would let one runner take the whole
                # queue in one go, while outcome writes, reports and incoming batches wait.
                await asyncio.sleep(0)
        finally:
            self._runners -= 1

    def _slot_done(self) -> None:
        self._performing -= 1
        if self._queue:
            self._pump()

    def _spawn(self, coro: Any, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Keep a reference to every task, so none is collected while it runs."""
        task = (loop or asyncio.get_running_loop()).create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def release(self, run: StepRun) -> None:
        if self._runs.get(run.key) is run:
            del self._runs[run.key]

    # -- stopping -------------------------------------------------------------------------

    async def stop_steps(self, request: StopRequest) -> StopResult:
        self._loop = asyncio.get_running_loop()
        result = StopResult()
        wanted = set(request.step_ids) if request.step_ids is not None else None
        for key, run in list(self._runs.items()):
            if key.job_key != request.job_key or key.job_id != request.job_id:
                continue
            if wanted is not None and key.step_id not in wanted:
                continue
            if run.generation > request.generation:
                continue  # a stop of an earlier execution never stops a resumed run
            run.cancel(request.removing)
            result.stopping.append(key.step_id)
            if run in self._queue:
                # Never started: it settles as stopped without taking a slot.
                self._queue.remove(run)
                self._spawn(run.execute())
        if wanted is not None:
            result.not_running = sorted(wanted - set(result.stopping))
        return result

    # -- reporting ------------------------------------------------------------------------

    def enqueue_report(self, key: RunKey, report: StepReport) -> None:
        self._reports.setdefault((key.job_key, key.job_id), []).append(report)
        if self._report_task is None or self._report_task.done():
            self._report_task = asyncio.get_running_loop().create_task(self._send_reports())

    async def _send_reports(self) -> None:
        """Send what is queued, without waiting for earlier sends to be answered.

        An answer comes back only as fast as this busy process gets to it; waiting for each
        before the next send would hold every later outcome back by that much. At most
        `_MAX_DELIVERIES` sends are in flight; outcomes queued meanwhile go in the next.
        """
        await asyncio.sleep(0)
        while self._reports:
            while len(self._deliveries) >= _MAX_DELIVERIES:
                await asyncio.wait(self._deliveries, return_when=asyncio.FIRST_COMPLETED)
            batches, self._reports = self._reports, {}
            loop = asyncio.get_running_loop()
            for (key, job_id), reports in batches.items():
                task = loop.create_task(self._deliver(key, job_id, reports))
                self._deliveries.add(task)
                task.add_done_callback(self._deliveries.discard)

    async def _deliver(self, key: JobKey, job_id: str, reports: list[StepReport]) -> None:
        delay = self.options.step_delivery_retry_delay.total_seconds()
        cap = self.options.max_step_delivery_retry_delay.total_seconds()
        for attempt in range(1, self.options.step_delivery_max_attempts + 1):
            try:
                await self.reporter.report(key, job_id, reports)
                return
            except Exception as error:
                if attempt == self.options.step_delivery_max_attempts:
                    log.warning(
                        "gave up reporting %d outcome(s) to job %s: %s; they are in storage "
                        "for the job to recount",
                        len(reports),
                        job_id,
                        error,
                    )
                    return
                log.info("report to job %s failed (%s); retrying in %.1fs", job_id, error, delay)
                await self.clock.sleep(delay)
                delay = min(cap, delay * 2)

    # -- shutting down --------------------------------------------------------------------

    async def close(self) -> None:
        """Deactivate: cancel every run without writing or reporting anything more."""
        self.closed = True
        self._queue.clear()
        for run in list(self._runs.values()):
            run.closed = True
            if run.runner is not None:
                run.runner.cancel()
        self._runs.clear()
        self.sync_runner.close()


async def _call(fn: Callable[..., None], *args: Any) -> None:
    fn(*args)


def _plain(payload: Payload | None) -> tuple[str, Any] | None:
    return None if payload is None else (payload.type, payload.data)


def _failed(step_id: str, reason: str) -> StartResult:
    return StartResult(step_id, StartOutcome.FAILED, StartJobStepError.UNKNOWN, reason)


def _finished_report(state: JobStepState) -> StepReport | None:
    if state.status in (
        JobStepStatus.COMPLETED_SUCCESSFULLY,
        JobStepStatus.COMPLETED_WITH_FAILURE,
        JobStepStatus.UNREACHABLE,
    ):
        return StepReport(
            step_id=state.id,
            status=state.status,
            generation=state.generation,
            attempt=state.attempt,
            stage=state.stage,
            name=state.name,
            result=_plain(state.result or (state.error.partial_result if state.error else None)),
            error=state.error,
            non_retryable=bool(state.error and state.error.non_retryable),
        )
    return None
