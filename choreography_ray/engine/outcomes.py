"""Step outcomes: counting them once, retrying failed attempts, and completing the job."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from pydantic import RootModel

from ..jobs.job import StepOutcome
from ..jobs.registry import Payload, TypeKind
from ..jobs.status import (
    RUNNING_JOB_STATUSES,
    JobStatus,
    JobStepStatus,
)
from . import progress as counting
from .activation import (
    Released,
)
from .messages import StepReport


class Outcomes:
    """What a job does with the outcomes its steps report."""

    # -- reports --------------------------------------------------------------------------------

    def deliver(self, reports: Sequence[StepReport]) -> None:
        """Queue outcomes from workers; they are counted in the job's own turn."""
        self._inbox.extend(reports)
        if self._drain_task is None or self._drain_task.done():
            self._drain_task = self._spawn(self._drain())

    async def _drain(self) -> None:
        while self._inbox and not self.released:
            async with self._turn:
                batch, self._inbox = self._inbox, []
                if self.released:
                    return
                try:
                    for report in batch:
                        await self._handle_report(report)
                    if self.state.status == JobStatus.RUNNING:
                        await self._advance(dispatch_failures_fail=False)
                    elif self.state.status in (JobStatus.STOPPED, JobStatus.REMOVING):
                        await self._finish_stop_if_settled()
                    await self._persist_progress()
                except Released:
                    return
                except Exception:
                    self.log.exception("job %s: handling step outcomes failed", self.id)
                    self._release("handling step outcomes failed")
                    return

    async def _persist_progress(self) -> None:
        if self.released or self.state.status == JobStatus.NONE:
            return
        if self.state.status.is_terminal and not self._keeps_state():
            return
        try:
            await self._save()
        except Exception as error:
            self._release(f"could not save progress: {error}")
            raise Released() from error

    async def _handle_report(self, report: StepReport, *, from_start: bool = False) -> None:
        self.counters.reports += 1
        status = self.state.status
        step_id = report.step_id
        if step_id in self._counted:
            self.counters.ignored_reports += 1
            return
        tracked = self._tracked.get(step_id)
        stop = report.status in (JobStepStatus.STOPPED, JobStepStatus.REMOVING)
        if stop and report.generation < self.state.execution_generation:
            # A late stop of an earlier execution: not ours to count; run the step again.
            self.counters.ignored_reports += 1
            if status == JobStatus.RUNNING and tracked is not None:
                self._tracked.pop(step_id)
                self._waiting.appendleft((step_id, tracked.attempt))
            return
        if status in RUNNING_JOB_STATUSES:
            if stop:
                # A step stopped without the job asking (its worker went away): run it again.
                self._tracked.pop(step_id, None)
                self._waiting.appendleft((step_id, report.attempt))
                return
            if report.status == JobStepStatus.COMPLETED_WITH_FAILURE and self._retry(report):
                return
        elif status not in (JobStatus.STOPPED, JobStatus.REMOVING):
            self.counters.ignored_reports += 1
            return
        if stop:
            key = step_id
            if key in self.state.stopped_steps_counted:
                self.counters.ignored_reports += 1
                return
            self.state.stopped_steps_counted = [*self.state.stopped_steps_counted, key]
        await self._count(report)

    def _allows_retry(self, outcome: StepOutcome, non_retryable: bool) -> bool:
        """The one rule for another attempt: attempts left, the step did not rule it out, and
        the job's `should_retry_step` agrees (a hook that raises says no)."""
        if non_retryable or outcome.attempt >= self._max_attempts:
            return False
        try:
            return bool(self.job.should_retry_step(outcome, outcome.error))  # type: ignore[arg-type]
        except Exception:
            self.log.exception("job %s: should_retry_step failed; not retrying", self.id)
            return False

    def _retry(self, report: StepReport) -> bool:
        """Schedule another attempt if one is allowed; True when the failure is not final."""
        if report.non_retryable or report.attempt >= self._max_attempts:
            return False  # decided before building the outcome, which costs a result load
        if not self._allows_retry(self._outcome(report), report.non_retryable):
            return False
        self._tracked.pop(report.step_id, None)
        delay = self._backoff(report.attempt)
        self._retries[report.step_id] = self._spawn(
            self._retry_later(report.step_id, report.attempt + 1, delay)
        )
        return True

    def _backoff(self, attempt: int) -> float:
        options = self.ctx.options
        base = options.step_retry_backoff.total_seconds()
        return min(options.max_step_retry_backoff.total_seconds(), base * 2 ** (attempt - 1))

    async def _retry_later(self, step_id: str, attempt: int, delay: float) -> None:
        try:
            await self.ctx.clock.sleep(delay)
        except asyncio.CancelledError:
            return
        async with self._turn:
            self._retries.pop(step_id, None)
            if self.released or self.state.status != JobStatus.RUNNING:
                return
            self._waiting.appendleft((step_id, attempt))
            try:
                await self._advance(dispatch_failures_fail=False)
                await self._persist_progress()
            except Released:
                return

    def _outcome(self, report: StepReport) -> StepOutcome:
        result = None
        if report.result is not None:
            try:
                result = self._typed_result(report)
            except Exception:
                self.log.exception("job %s: result of step %s unreadable", self.id, report.step_id)
        return StepOutcome(
            step_id=report.step_id,
            name=report.name or self._names.get(report.step_id, ""),
            stage=report.stage,
            status=report.status,
            attempt=report.attempt,
            result=result,
            error=report.error,
        )

    def _typed_result(self, report: StepReport) -> Any:
        """The result as the step declared it: a plain value for results wrapped in a
        RootModel (an `int` result, say), the model itself otherwise."""
        assert report.result is not None
        type_name, data = report.result
        model = self.ctx.registry.load(Payload(type=type_name, data=data), TypeKind.RESULT)
        return model.root if isinstance(model, RootModel) else model

    async def _count(self, report: StepReport) -> None:
        self._tracked.pop(report.step_id, None)
        self._counted.add(report.step_id)
        counting.count(self.state.progress, report.stage, report.status)
        self.job.info.progress = self.state.progress
        if not self._hears_outcomes:
            return  # the job does not override the hook: no outcome to build per step
        try:
            await self._hook("on_step_completed_or_stopped", self._outcome(report))
        except Exception as error:
            self.log.exception("job %s: on_step_completed_or_stopped failed", self.id)
            self.counters.hook_errors.append(str(error))

    # -- completion -----------------------------------------------------------------------------

    def _keeps_state(self) -> bool:
        status = self.state.status
        if status == JobStatus.FAILED:
            return True
        if status == JobStatus.COMPLETED_WITH_FAILURES:
            return self.job_class.keep_after_completed_with_failures
        if status == JobStatus.COMPLETED_SUCCESSFULLY:
            return self.job_class.keep_after_completed
        return True

    async def _complete_safely(self) -> None:
        with contextlib.suppress(Released):
            await self._complete()

    async def _complete(self) -> None:
        """Every step has an outcome: run the hook, write the outcome, clear or keep state."""
        progress = self.state.progress
        try:
            await self._hook("on_all_steps_completed")
        except Exception as error:
            self._change(JobStatus.FAILED, error)
        else:
            status = (
                JobStatus.COMPLETED_WITH_FAILURES
                if progress.has_failures
                else JobStatus.COMPLETED_SUCCESSFULLY
            )
            self._change(status)
        try:
            await self._save()
        except Exception as error:
            self._release(f"could not write the outcome: {error}")
            raise Released() from error
        if self.state.stored_step_plan_incarnation is not None:
            await self._delete_plan(self.state.stored_step_plan_incarnation)
        if not self._keeps_state():
            await self._clear()
        self._finished()

    async def _clear(self) -> None:
        """Delete the steps, then the job: what remains after a crash is still a whole job."""
        try:
            await self.ctx.storage.steps.remove_all_for_job(self.id)
            await self.ctx.storage.jobs.remove(self.id)
        except Exception:
            self.log.exception("job %s: could not clear its state", self.id)
            raise

    def _finished(self) -> None:
        for task in self._retries.values():
            task.cancel()
        self._retries.clear()
        self._release_quietly()

    def _release_quietly(self) -> None:
        if not self.released:
            self.released = True
            if self._on_release is not None:
                self._on_release(self)
