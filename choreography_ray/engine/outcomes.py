"""Step outcomes: counting each once, deciding on another attempt, and completing the job."""

from __future__ import annotations

import contextlib
from typing import Any

from pydantic import RootModel

from ..jobs.job import StepOutcome
from ..jobs.registry import Payload, TypeKind
from ..jobs.status import RUNNING_JOB_STATUSES, JobStatus, JobStepStatus
from . import progress as counting
from .activation import ActivationCore
from .messages import StepReport
from .record import Released
from .retrying import Decision, Verdict


class Outcomes:
    """What a job does with the outcomes its steps report, and with the last one."""

    def __init__(self, core: ActivationCore) -> None:
        self.core = core
        self.record = core.record
        self.ledger = core.ledger

    async def handle(self, report: StepReport) -> Decision | None:
        """Count a report, or requeue or ignore it. Returns the decision to try a failed
        attempt again, which the caller schedules (`Stages.retry`); None otherwise."""
        record = self.record
        ledger = self.ledger
        record.counters.reports += 1
        state = record.state
        status = state.status
        step_id = report.step_id
        if ledger.is_counted(step_id) and not self._takes_back_stop(report):
            ledger.forget(step_id)  # told once more, it has now reported
            record.counters.ignored_reports += 1
            return None
        tracked = ledger.entry(step_id)
        if ledger.is_retrying(step_id) or (
            tracked is not None and report.attempt < tracked.attempt
        ):
            # An attempt already decided on, told again (a delivery retried after its answer
            # was lost): deciding again would schedule a second retry and store a decision
            # under the next attempt's run.
            record.counters.ignored_reports += 1
            return None
        stop = report.status in (JobStepStatus.STOPPED, JobStepStatus.REMOVING)
        if stop and report.generation < state.execution_generation:
            # A late stop of an earlier execution: not ours to count; run the step again.
            record.counters.ignored_reports += 1
            if status == JobStatus.RUNNING and tracked is not None:
                ledger.forget(step_id)
                ledger.queue([(step_id, tracked.attempt)])
            return None
        if status in RUNNING_JOB_STATUSES:
            if stop:
                # A step stopped without the job asking (its worker went away): run it again.
                ledger.forget(step_id)
                ledger.queue([(step_id, report.attempt)])
                return None
            if report.status == JobStepStatus.COMPLETED_WITH_FAILURE:
                decision = self.decide(report)
                if decision.verdict is Verdict.RETRY:
                    return decision
        elif status not in (JobStatus.STOPPED, JobStatus.REMOVING):
            record.counters.ignored_reports += 1
            return None
        if stop and not ledger.count_stop(state, step_id):
            record.counters.ignored_reports += 1
            return None
        await self.count(report)
        return None

    def _takes_back_stop(self, report: StepReport) -> bool:
        """A step counted as stopped whose run then ends with a success, or a failure (no
        attempt is left for a stopped job): the outcome replaces the stop, in the same write,
        so the job's counts stay equal to step storage. Only while the job is stopped or being
        removed: that is when stops are counted."""
        state = self.record.state
        step_id = report.step_id
        if state.status not in (JobStatus.STOPPED, JobStatus.REMOVING):
            return False
        if report.status not in (
            JobStepStatus.COMPLETED_SUCCESSFULLY,
            JobStepStatus.COMPLETED_WITH_FAILURE,
        ):
            return False
        if not self.ledger.take_back_stop(state, step_id):
            return False
        counting.uncount_stop(state.progress)
        return True

    def decide(self, report: StepReport) -> Decision:
        """The one decision on a reported or stored outcome (`retrying.decide`), made once: a
        decision the report carries for its attempt stands; a new one is stored with the step
        before the job record's next write (`JobRecord.decided`). The job's hook sees the
        outcome only when the policy leaves a retry (building it costs a result load)."""
        core = self.core
        decision = core.retry.decide(
            report,
            self.ledger.types.of(report.step_id),
            core.ctx.clock.now(),
            lambda: self.outcome(report),
        )
        stored = report.decision
        if decision.verdict is not Verdict.COUNT and (
            stored is None or stored.attempt != report.attempt
        ):
            self.record.decided(report.step_id, decision.stored(report.attempt))
        return decision

    async def count(self, report: StepReport) -> None:
        """Count the step's outcome once and tell the job's hook."""
        self.ledger.settle(report.step_id)
        progress = self.record.state.progress
        counting.count(progress, report.stage, report.status)
        core = self.core
        core.job.info.progress = progress
        if not core.hears_outcomes:
            return  # the job does not override the hook: no outcome to build per step
        try:
            await core.hook("on_step_completed_or_stopped", self.outcome(report))
        except Exception as error:
            core.log.exception("job %s: on_step_completed_or_stopped failed", core.id)
            core.counters.hook_errors.append(str(error))

    def outcome(self, report: StepReport) -> StepOutcome:
        """The report as the job's hooks see it, with its result typed."""
        result = None
        if report.result is not None:
            try:
                result = self._typed_result(report)
            except Exception:
                self.core.log.exception(
                    "job %s: result of step %s unreadable", self.core.id, report.step_id
                )
        return StepOutcome(
            step_id=report.step_id,
            name=report.name or self.ledger.name_of(report.step_id),
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
        model = self.core.ctx.registry.load(Payload(type=type_name, data=data), TypeKind.RESULT)
        return model.root if isinstance(model, RootModel) else model

    # -- completion -----------------------------------------------------------------------------

    async def complete_safely(self) -> None:
        with contextlib.suppress(Released):
            await self.complete()

    async def complete(self) -> None:
        """Every step has an outcome: run the hook, write the outcome, clear or keep state."""
        record = self.record
        try:
            await self.core.hook("on_all_steps_completed")
        except Exception as error:
            record.change(JobStatus.FAILED, error)
        else:
            status = (
                JobStatus.COMPLETED_WITH_FAILURES
                if record.state.progress.has_failures
                else JobStatus.COMPLETED_SUCCESSFULLY
            )
            record.change(status)
        try:
            await record.save()
        except Exception as error:
            record.release(f"could not write the outcome: {error}")
            raise Released() from error
        if record.state.stored_step_plan_incarnation is not None:
            await record.delete_plan(record.state.stored_step_plan_incarnation)
        if not record.keeps_state():
            await record.clear()
        self.finish()

    def finish(self) -> None:
        """The job needs this activation no more: no retry fires, and the manager lets go."""
        self.ledger.cancel_retries()
        self.record.release()
