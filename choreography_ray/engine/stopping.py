"""Stop and remove: persisted first, then every step that may run is told or counted."""

from __future__ import annotations

from ..jobs.errors import RemoveJobError, RemoveJobFailed, StopJobError, StopJobFailed
from ..jobs.status import RUNNING_JOB_STATUSES, JobStatus, JobStepStatus
from . import progress as counting
from .activation import ActivationCore
from .ledger import Tracked
from .messages import StepReport, StopRequest
from .outcomes import Outcomes
from .recount import Recount


class Stopping:
    """Stopping and removing a job, and finishing a stop after a crash. The caller holds the
    job's turn."""

    def __init__(self, core: ActivationCore, outcomes: Outcomes, recount: Recount) -> None:
        self.core = core
        self.record = core.record
        self.ledger = core.ledger
        self.outcomes = outcomes
        self.recount = recount

    async def stop(self) -> None:
        record = self.record
        state = record.state
        status = state.status
        if status.is_terminal:
            raise StopJobFailed("the job has completed", code=StopJobError.JOB_IS_COMPLETED)
        if status not in RUNNING_JOB_STATUSES:
            raise StopJobFailed(
                f"the job is {status.name}, not running", code=StopJobError.JOB_IS_NOT_RUNNING
            )
        previous = (state.status, state.status_changes, state.stop_finalized)
        record.change(JobStatus.STOPPED)
        state.stop_finalized = False
        try:
            await record.save()
        except Exception as error:
            state.status, state.status_changes, state.stop_finalized = previous
            record.release(f"could not persist the stop: {error}")
            raise StopJobFailed(
                f"the stop could not be written: {error}",
                code=StopJobError.COULD_NOT_PERSIST_STOP,
            ) from error
        await self._stop_steps(removing=False)

    async def remove(self) -> None:
        record = self.record
        status = record.state.status
        if status.is_terminal:
            raise RemoveJobFailed("the job has completed", code=RemoveJobError.JOB_IS_COMPLETED)
        if status == JobStatus.REMOVING:
            try:
                await self.finish_if_settled()
            except Exception as error:
                raise RemoveJobFailed(str(error), code=RemoveJobError.UNKNOWN) from error
            raise RemoveJobFailed(
                "the job is already being removed",
                code=RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED,
            )
        record.change(JobStatus.REMOVING)
        record.state.stop_finalized = False
        try:
            await record.save()
        except Exception as error:
            raise RemoveJobFailed(
                f"the removal could not be written: {error}", code=RemoveJobError.UNKNOWN
            ) from error
        await self._stop_steps(removing=True)

    async def finish_stop(self) -> None:
        """Finish a stop or removal that an earlier activation could not (after a crash)."""
        state = self.record.state
        if state.status not in (JobStatus.STOPPED, JobStatus.REMOVING):
            return
        if state.stop_finalized and state.status == JobStatus.STOPPED:
            return
        await self._stop_steps(removing=state.status == JobStatus.REMOVING)

    async def _candidates(self) -> set[str]:
        """Steps that may still run and must be stopped, or counted as stopped."""
        ledger = self.ledger
        candidates = ledger.take_in_flight()
        if ledger.loaded and ledger.current is not None:
            return candidates
        # A fresh activation: recount from storage, as the stored progress may lag behind.
        steps, pending = await self.recount.load(strict=False)
        state = self.record.state
        state.stopped_steps_counted = []
        for step in steps:
            if step.status in (JobStepStatus.STOPPED, JobStepStatus.REMOVING):
                state.stopped_steps_counted.append(step.id)
                counting.count(state.progress, step.stage, JobStepStatus.STOPPED)
                ledger.counted.add(step.id)
        stage = ledger.first_open_stage()
        if stage is not None:
            counting.mark_started(state.progress, stage)
            candidates.update(
                step_id for step_id, _ in pending.get(stage, ()) if step_id not in ledger.counted
            )
        return candidates

    async def _stop_steps(self, *, removing: bool) -> None:
        """Tell workers to stop; count at once every step that is not running anywhere."""
        candidates = await self._candidates()
        core = self.core
        state = self.record.state
        ledger = self.ledger
        stopping: set[str] = set()
        placed: dict[str, list[str]] = {}
        if candidates:
            try:
                answer = await core.ctx.dispatcher.stop_steps(
                    StopRequest(
                        job_key=core.ctx.key,
                        job_id=core.id,
                        generation=state.execution_generation,
                        step_ids=tuple(sorted(candidates)),
                        removing=removing,
                    )
                )
                stopping = set(answer.stopping)
                placed = answer.hosts
            except Exception:
                core.log.exception("job %s: telling workers to stop failed", core.id)
        for step_id in stopping:
            if step_id not in ledger.tracked:
                ledger.tracked[step_id] = Tracked(
                    ledger.stage_of.get(step_id, 0), 1, state.execution_generation
                )
        ledger.place(placed, state.execution_generation)
        await self._count_stopped(sorted(candidates - stopping), removing=removing)
        await self.finish_if_settled()
        await self.record.save_progress()

    async def lost(self, step_ids: list[str]) -> None:
        """Steps whose worker host is gone while the job stops: nothing runs them any more,
        so they count as stopped, and the stop finishes once the others have reported."""
        await self._count_stopped(
            sorted(step_ids), removing=self.record.state.status == JobStatus.REMOVING
        )
        await self.finish_if_settled()

    async def _count_stopped(self, step_ids: list[str], *, removing: bool) -> None:
        """Count steps that run nowhere as stopped, once per execution."""
        state = self.record.state
        ledger = self.ledger
        status = JobStepStatus.REMOVING if removing else JobStepStatus.STOPPED
        for step_id in step_ids:
            ledger.tracked.pop(step_id, None)
            if step_id in ledger.counted or step_id in state.stopped_steps_counted:
                continue
            state.stopped_steps_counted = [*state.stopped_steps_counted, step_id]
            await self.outcomes.count(
                StepReport(
                    step_id=step_id,
                    status=status,
                    generation=state.execution_generation,
                    attempt=1,
                    stage=ledger.stage_of.get(step_id, 0),
                    name=ledger.names.get(step_id, ""),
                )
            )

    async def finish_if_settled(self) -> None:
        """Once no step runs any more: `on_stopped`, and a removal clears the job."""
        record = self.record
        state = record.state
        if state.stop_finalized or not state.progress.is_stopped:
            return
        if self.ledger.tracked:
            return
        try:
            await self.core.hook("on_stopped")
        except Exception as error:
            self.core.log.exception("job %s: on_stopped failed", self.core.id)
            if state.status == JobStatus.REMOVING:
                raise RemoveJobFailed(
                    f"on_stopped failed: {error}", code=RemoveJobError.UNKNOWN
                ) from error
        if state.status == JobStatus.REMOVING:
            if state.stored_step_plan_incarnation is not None:
                await record.delete_plan(state.stored_step_plan_incarnation)
            await record.clear()
            self.outcomes.finish()
            return
        state.stop_finalized = True
