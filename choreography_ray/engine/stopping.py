"""Stop and remove: persisted first, then every step that may run is told or counted."""

from __future__ import annotations

from ..jobs.errors import (
    RemoveJobError,
    RemoveJobFailed,
    StopJobError,
    StopJobFailed,
)
from ..jobs.status import (
    RUNNING_JOB_STATUSES,
    JobStatus,
    JobStepStatus,
)
from . import progress as counting
from .activation import (
    _Tracked,
)
from .messages import StepReport, StopRequest


class Stopping:
    """Stopping and removing a job, and finishing a stop after a crash."""

    # -- stop and remove --------------------------------------------------------------------

    async def stop(self) -> None:
        async with self._turn:
            status = self.state.status
            if status.is_terminal:
                raise StopJobFailed("the job has completed", code=StopJobError.JOB_IS_COMPLETED)
            if status not in RUNNING_JOB_STATUSES:
                raise StopJobFailed(
                    f"the job is {status.name}, not running", code=StopJobError.JOB_IS_NOT_RUNNING
                )
            previous = (self.state.status, self.state.status_changes, self.state.stop_finalized)
            self._change(JobStatus.STOPPED)
            self.state.stop_finalized = False
            try:
                await self._save()
            except Exception as error:
                self.state.status, self.state.status_changes, self.state.stop_finalized = previous
                self._release(f"could not persist the stop: {error}")
                raise StopJobFailed(
                    f"the stop could not be written: {error}",
                    code=StopJobError.COULD_NOT_PERSIST_STOP,
                ) from error
            await self._stop_steps(removing=False)

    async def remove(self) -> None:
        async with self._turn:
            status = self.state.status
            if status.is_terminal:
                raise RemoveJobFailed("the job has completed", code=RemoveJobError.JOB_IS_COMPLETED)
            if status == JobStatus.REMOVING:
                try:
                    await self._finish_stop_if_settled()
                except Exception as error:
                    raise RemoveJobFailed(str(error), code=RemoveJobError.UNKNOWN) from error
                raise RemoveJobFailed(
                    "the job is already being removed",
                    code=RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED,
                )
            self._change(JobStatus.REMOVING)
            self.state.stop_finalized = False
            try:
                await self._save()
            except Exception as error:
                raise RemoveJobFailed(
                    f"the removal could not be written: {error}", code=RemoveJobError.UNKNOWN
                ) from error
            await self._stop_steps(removing=True)

    async def finish_stop(self) -> None:
        """Finish a stop or removal that an earlier activation could not (after a crash)."""
        async with self._turn:
            if self.state.status not in (JobStatus.STOPPED, JobStatus.REMOVING):
                return
            if self.state.stop_finalized and self.state.status == JobStatus.STOPPED:
                return
            await self._stop_steps(removing=self.state.status == JobStatus.REMOVING)

    async def _stop_candidates(self) -> set[str]:
        """Steps that may still run and must be stopped, or counted as stopped."""
        for task in self._retries.values():
            task.cancel()
        candidates = set(self._tracked) | set(self._retries)
        candidates.update(step_id for step_id, _ in self._waiting)
        self._retries.clear()
        self._waiting.clear()
        if self._loaded and self._current_stage is not None:
            return candidates
        # A fresh activation: recount from storage, as the stored progress may lag behind.
        steps = await self._load_steps()
        pending = self._reconcile(steps)
        self.state.stopped_steps_counted = []
        for step in steps:
            if step.status in (JobStepStatus.STOPPED, JobStepStatus.REMOVING):
                self.state.stopped_steps_counted.append(step.id)
                counting.count(self.state.progress, step.stage, JobStepStatus.STOPPED)
                self._counted.add(step.id)
        stage = self._first_open_stage()
        if stage is not None:
            counting.mark_started(self.state.progress, stage)
            candidates.update(
                step_id for step_id, _ in pending.get(stage, ()) if step_id not in self._counted
            )
        return candidates

    async def _stop_steps(self, *, removing: bool) -> None:
        """Tell workers to stop; count at once every step that is not running anywhere."""
        candidates = await self._stop_candidates()
        stopping: set[str] = set()
        if candidates:
            try:
                answer = await self.ctx.dispatcher.stop_steps(
                    StopRequest(
                        job_key=self.ctx.key,
                        job_id=self.id,
                        generation=self.state.execution_generation,
                        step_ids=tuple(sorted(candidates)),
                        removing=removing,
                    )
                )
                stopping = set(answer.stopping)
            except Exception:
                self.log.exception("job %s: telling workers to stop failed", self.id)
        for step_id in stopping:
            if step_id not in self._tracked:
                self._tracked[step_id] = _Tracked(
                    self._stage_of.get(step_id, 0), 1, self.state.execution_generation
                )
        status = JobStepStatus.REMOVING if removing else JobStepStatus.STOPPED
        for step_id in sorted(candidates - stopping):
            self._tracked.pop(step_id, None)
            if step_id in self._counted or step_id in self.state.stopped_steps_counted:
                continue
            self.state.stopped_steps_counted = [*self.state.stopped_steps_counted, step_id]
            await self._count(
                StepReport(
                    step_id=step_id,
                    status=status,
                    generation=self.state.execution_generation,
                    attempt=1,
                    stage=self._stage_of.get(step_id, 0),
                    name=self._names.get(step_id, ""),
                )
            )
        await self._finish_stop_if_settled()
        await self._persist_progress()

    async def _finish_stop_if_settled(self) -> None:
        if self.state.stop_finalized or not self.state.progress.is_stopped:
            return
        if self._tracked:
            return
        try:
            await self._hook("on_stopped")
        except Exception as error:
            self.log.exception("job %s: on_stopped failed", self.id)
            if self.state.status == JobStatus.REMOVING:
                raise RemoveJobFailed(
                    f"on_stopped failed: {error}", code=RemoveJobError.UNKNOWN
                ) from error
        if self.state.status == JobStatus.REMOVING:
            if self.state.stored_step_plan_incarnation is not None:
                await self._delete_plan(self.state.stored_step_plan_incarnation)
            await self._clear()
            self._finished()
            return
        self.state.stop_finalized = True
