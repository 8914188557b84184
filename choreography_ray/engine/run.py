"""One run of one step: the context its work sees, its Running and outcome writes, its report.

A run loads the step's state, writes Running, performs, and settles: the outcome goes to the
group commit, and the report goes to the job only once the outcome is durable. A run whose
record changed under it (a stale run) stops and reports nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from ..jobs.errors import ActivationCallbackRejected
from ..jobs.registry import TypeKind, trusted, trusted_sharing
from ..jobs.retry import error_type_name
from ..jobs.state import JobStepProgress, KeyWait, StatusChange, StepError, StepLease
from ..jobs.status import JobStepStatus
from ..jobs.step import JobStep, StepCancelled, StepContext, StepFailed
from .context import error_messages
from .messages import StepReport, StepStart
from .run_host import CallbackRejected, RunHost, RunKey
from .step_keys import StepPlace
from .stored_steps import outcome_report
from .writer import StaleRecord, StepWriter, Tracked

log = logging.getLogger("choreography_ray.engine")

_DONE = JobStepProgress(percentage=100.0, message="")
_STEP_CHANGE_FIELDS = {"status", "occurred", "exception_messages", "exception_stack_trace"}
"""The fields a step's status change sets (a step's has no host), shared by all of them."""


class StepRun:
    """One run of one step; its work sees it only through `context` (`StepContext`)."""

    def __init__(
        self,
        worker: RunHost,
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
        self.urgent = False
        """Sent again after its run was lost: queued ahead of its job's other runs."""
        self.place: StepPlace | None = None  # of its step-level concurrency key, if any
        self.cancel_work: Callable[[], None] | None = None
        """Set by a runner whose work runs elsewhere, to cancel it there."""
        self._flush_timer: asyncio.Task[None] | None = None
        self._partition_writer: StepWriter | None = None
        self._done: asyncio.Future[None] | None = None
        self._ended = False
        self._report: StepReport | None = None
        self.persisted: StepReport | None = None
        """The outcome, once written: what a stop that waits for the run answers."""

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

    @property
    def context(self) -> StepContext:
        """What the step's work is given: the run's callbacks, none of its internals. Made
        when asked, never kept: a run holding its context would make a reference cycle per
        step, which only the garbage collector frees (a third of a no-op step's CPU)."""
        return StepContext(self)

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
            self._renew_lease()
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
            self._renew_lease()
            self._write_later()

    def _renew_lease(self) -> None:
        """With leases on, a state write carries a fresh heartbeat once a third of the lease
        timeout has passed since the last one (the seed's renewal rule)."""
        timeout = self.worker.options.step_lease_timeout
        lease = self.record.state.lease
        if timeout <= timedelta(0) or lease is None:
            return
        now = self.worker.clock.now()
        if now - lease.heartbeat >= timeout / 3:
            self._set(lease=lease.model_copy(update={"heartbeat": now}))

    def called_back(self, kind: str, value: Any) -> bool:
        """A call from this run's work running elsewhere (a Ray task), on the loop: a
        checkpoint or progress, applied at once, or only whether the run was asked to stop."""
        self._check_open()
        if kind == "checkpoint":
            self._checkpoint(value)
        elif kind == "progress":
            self._progress(*value)
        return self.cancelled

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

    def now(self) -> datetime:
        return self.worker.clock.now()

    def wait_for_key(self, wait: KeyWait | None, *, write: bool) -> None:
        self._set(waiting_for_key=wait)  # on its record: it waits for its key's place, or not
        if write:
            self._write_later()

    # -- the run ----------------------------------------------------------------------------

    def _set(self, **changes: Any) -> None:
        self._update(changes)

    def _update(self, changes: dict[str, Any]) -> None:
        """Replace fields, never mutate them: a flush may be copying the record meanwhile.

        Does what pydantic's assignment does for a field without validation (store the value,
        mark the field set), for all changes at once: every value here is already valid, and
        going through `setattr` costs about a tenth more CPU per no-op step (decisions.md)."""
        state = self.record.state
        state.__dict__.update(changes)
        state.__pydantic_fields_set__.update(changes)

    def _status(
        self, status: JobStepStatus, error: StepError | None, changes: dict[str, Any]
    ) -> None:
        """Enter `status` for `error`, making the record's other `changes` in the same update."""
        change = {
            "status": int(status),
            "occurred": self.worker.clock.now(),
            "exception_messages": list(error.messages) if error else [],
            "exception_stack_trace": error.stack_trace if error else "",
        }
        changes["status"] = status
        changes["status_changes"] = [
            *self.record.state.status_changes,
            trusted_sharing(StatusChange, _STEP_CHANGE_FIELDS, change),
        ]
        self._update(changes)

    @property
    def _writer(self) -> StepWriter:
        """The group commit of the run's partition, looked up once per run."""
        writer = self._partition_writer
        if writer is None:
            writer = self._partition_writer = self.worker.writer_for(self.key.job_key)
        return writer

    def _write_later(self) -> None:
        """Checkpoints and Running: the outcome's write, waited for, comes after them."""
        self._writer.write_later(self.record)

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
        writing = False
        try:
            writing = await self._execute()
        except Exception:
            self.log.exception(
                "run of step %s of job %s failed to settle", self.step_id, self.job_id
            )
        finally:
            if not writing:
                self.end()

    def _written(self, error: BaseException | None) -> None:
        """The outcome is durable (`error` None), and is reported; or it was not written."""
        report, self._report = self._report, None
        if error is None:
            assert report is not None  # set by `_settle` with the write it reports
            if self._started is not None:
                self.worker.metrics.step_finished(
                    report.status, time.perf_counter() - self._started
                )
            self.persisted = report
            self.worker.enqueue_report(self.key, report)
        elif isinstance(error, StaleRecord):
            self.log.info("stale run of step %s of job %s ended", self.step_id, self.job_id)
        else:
            self.log.error(
                "the outcome of step %s of job %s was not written: %s; the job recounts it "
                "from storage",
                self.step_id,
                self.job_id,
                error,
            )
        self.end()

    def end(self) -> None:
        """The run is over, written or not: forget it and wake whoever waits for its end."""
        self.closed = True
        if self._flush_timer is not None:
            self._flush_timer.cancel()
        self.worker.release(self)
        self._ended = True
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    async def _execute(self) -> bool:
        registry = self.worker.registry
        step = self.step_class()
        stored = self.record.state
        user_state = registry.load(stored.state, TypeKind.STATE) if stored.state else None
        self._user_state = user_state
        if self.cancelled:
            return self._settle_stopped(step)
        if self.step_class.is_async():
            return await self._perform(step)
        # A synchronous step's Ray task takes a CPU: it waits for one still Scheduled, so
        # that Running means performing, and a stop meanwhile settles it at once.
        slots = self.worker.sync_slots
        self.runner = asyncio.current_task()
        try:
            await slots.acquire()
        except asyncio.CancelledError:
            if not self.cancelled:
                raise
            return self._settle_stopped(step)
        finally:
            self.runner = None
        try:
            if self.cancelled:
                return self._settle_stopped(step)
            return await self._perform(step)
        finally:
            slots.release()

    async def _perform(self, step: JobStep[Any, Any, Any]) -> bool:
        registry = self.worker.registry
        # Who runs the step, always: a job that sends the step again sends it back here, and
        # another worker asked to run it asks this host first. The heartbeat is renewed only
        # with leases on (`step_lease_timeout`).
        worker = self.worker
        lease = trusted(
            StepLease,
            node=worker.node_id,
            activation=worker.activation_id,
            heartbeat=worker.clock.now(),
            host=worker.host,
        )
        running = {"attempt": self.attempt, "generation": self.generation, "lease": lease}
        running["error"] = running["decision"] = None  # the last attempt's, if any, are gone
        self._status(JobStepStatus.RUNNING, None, running)
        self._write_later()  # the outcome's write follows it in order, and is waited for
        self._started = time.perf_counter()
        self.worker.metrics.step_started()
        try:
            if self.step_class.is_async():
                self.runner = asyncio.current_task()
                try:
                    result = await step.perform(self._user_state, self.context)
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
                error_type=error_type_name(type(failure)),
                retry_after=failure.retry_after,
                throttled=failure.throttled,
            )
            return self._settle(JobStepStatus.COMPLETED_WITH_FAILURE, error=error)
        except Exception as failure:
            if self.cancelled and isinstance(failure, CallbackRejected):
                return self._settle_stopped(step)
            error = StepError(
                messages=error_messages(failure),
                stack_trace=traceback.format_exc(),
                error_type=error_type_name(type(failure)),
            )
            return self._settle(JobStepStatus.COMPLETED_WITH_FAILURE, error=error)
        try:
            wrapped = step.wrap_result(result)
            payload = registry.dump(wrapped) if wrapped is not None else None
        except Exception as failure:  # a result of another type than the step declares
            error = StepError(
                messages=[
                    f"the step's result cannot be stored: {'; '.join(error_messages(failure))}"
                ],
                stack_trace=traceback.format_exc(),
                error_type=error_type_name(type(failure)),
            )
            return self._settle(JobStepStatus.COMPLETED_WITH_FAILURE, error=error)
        return self._settle(JobStepStatus.COMPLETED_SUCCESSFULLY, result=payload)

    def _settle_stopped(self, step: JobStep[Any, Any, Any]) -> bool:
        partial = None
        if self._user_state is not None:
            try:
                value = step.create_cancelled_result_from_current_state(self._user_state)
                if value is not None:  # None: the step has no partial result to offer
                    partial = step.wrap_result(value)
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
            self.worker.slot_freed()

    def _settle(
        self, status: JobStepStatus, *, result: Any = None, error: StepError | None = None
    ) -> bool:
        """Write the outcome; `_written` reports it once durable, so nothing is counted
        unsaved, and ends the run. Not once the host shuts down (False: nothing written, the
        run ends now): the step stays Scheduled or Running for recovery."""
        self.closed = True
        self.release_slot()
        if self.worker.closed:
            return False
        # The lease stays with the outcome: which run stored it (host, activation; the attempt
        # and generation are the record's own). A run stopped before it ran has none.
        lease = self.record.state.lease if self._started is not None else None
        changes: dict[str, Any] = {"result": result, "error": error, "lease": lease}
        if self._user_state is not None:
            changes["state"] = self.worker.registry.dump(self._user_state)
        if status == JobStepStatus.COMPLETED_SUCCESSFULLY:
            changes["progress"] = _DONE
        self._status(status, error, changes)
        self._report = outcome_report(self.record.state, self.generation, self.attempt)
        self._writer.write(self.record, self._written)  # `_written` ends the run
        return True
