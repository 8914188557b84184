"""Resume: from the saved plan or from step storage, never by planning again."""

from __future__ import annotations

from typing import Any

from ..jobs.errors import (
    CannotResumeJobError,
    ResumeJobFailed,
    ResumeJobSuccess,
    StartJobError,
)
from ..jobs.job import StepOutcome
from ..jobs.state import JobStepState, PlannedStep
from ..jobs.status import (
    FAILED_STEP_STATUSES,
    JobStatus,
    JobStepStatus,
)
from . import progress as counting
from .activation import (
    _stage_sizes,
)


class Resuming:
    """Resuming a stopped or interrupted job, recounting from storage."""

    # -- resume -----------------------------------------------------------------------------

    async def resume(self, *, recovering: bool = False) -> ResumeJobSuccess:
        async with self._turn:
            return await self._resume(recovering)

    async def _resume(self, recovering: bool) -> ResumeJobSuccess:
        status = self.state.status
        if status.is_terminal:
            return ResumeJobSuccess.JOB_IS_COMPLETED
        if status == JobStatus.REMOVING:
            raise ResumeJobFailed(
                "the job is being removed", code=CannotResumeJobError.JOB_CANNOT_BE_RESUMED
            )
        if self.state.pending_drain:
            raise ResumeJobFailed(
                "a drain of the job is still pending",
                code=CannotResumeJobError.JOB_CANNOT_BE_RESUMED,
            )
        if status == JobStatus.RUNNING and (self._tracked or self._waiting or self._retries):
            return ResumeJobSuccess.JOB_ALREADY_RUNNING
        if not self.job_class.can_resume:
            raise ResumeJobFailed(
                "the job does not allow resuming", code=CannotResumeJobError.JOB_CANNOT_BE_RESUMED
            )
        if status in (JobStatus.PREPARING_JOB, JobStatus.PREPARING_STEPS, JobStatus.STARTING_STEPS):
            return await self._resume_preparation()
        if status not in (JobStatus.RUNNING, JobStatus.STOPPED):
            raise ResumeJobFailed(
                f"the job is {status.name}", code=CannotResumeJobError.JOB_IS_NOT_PREPARED
            )
        return await self._resume_running(from_stop=status == JobStatus.STOPPED)

    async def _resume_preparation(self) -> ResumeJobSuccess:
        plan = await self._load_plan()
        if plan is None:
            raise ResumeJobFailed(
                "the job has no saved plan: it was interrupted before its plan was saved; "
                "remove it and start it again",
                code=CannotResumeJobError.MISSING_STEP_PLAN,
            )
        self._index_plan(plan)
        if not self.state.progress.total_steps and plan:
            self.state.progress = counting.planned(_stage_sizes(plan))
        if self.state.status == JobStatus.PREPARING_JOB:
            self._change(JobStatus.PREPARING_STEPS)
            await self._save()
        if not plan:
            await self._complete_safely()
            return ResumeJobSuccess.JOB_IS_COMPLETED
        stored = await self.ctx.storage.steps.get_for_job(self.id)
        existing = {step.id for step in stored if step.is_prepared}
        result = await self._prepare_and_run(plan, existing, clean_start=False)
        if not result.succeeded and result.error not in (
            StartJobError.FAILED_STARTING_SOME_JOB_STEPS,
            StartJobError.ALL_JOB_STEPS_FAILED_STARTING,
        ):
            raise ResumeJobFailed(
                f"resuming the preparation failed: {result.reason or result.error}",
                code=CannotResumeJobError.UNKNOWN,
            )
        return ResumeJobSuccess.SUCCESS

    async def _load_plan(self) -> list[PlannedStep] | None:
        if self.state.plan is not None:
            return list(self.state.plan)
        if self.state.has_stored_step_plan and self.state.stored_step_plan_incarnation:
            plans = self.ctx.storage.plans
            if plans is None:
                return None
            return await plans.load_plan(self.id, self.state.stored_step_plan_incarnation)
        return None

    async def _load_steps(self) -> list[JobStepState]:
        steps = await self.ctx.storage.steps.get_for_job(self.id)
        self._index_steps(steps)
        return steps

    async def _resume_running(self, *, from_stop: bool) -> ResumeJobSuccess:
        steps = await self._load_steps()
        previous = (
            self.state.status,
            self.state.status_changes,
            self.state.execution_generation,
            self.state.stopped_steps_counted,
            self.state.stop_finalized,
            self.state.progress,
        )
        self._reconcile(steps)
        if from_stop:
            self.state.execution_generation += 1
            self.state.stop_finalized = False
        self.state.stopped_steps_counted = []
        self._change(JobStatus.RUNNING)
        try:
            await self._save()
        except Exception as error:
            self._release(f"could not write Running: {error}")
            raise ResumeJobFailed(
                f"could not write Running: {error}", code=CannotResumeJobError.UNKNOWN
            ) from error
        if self.state.progress.is_completed:
            await self._complete()
            return ResumeJobSuccess.JOB_IS_COMPLETED
        try:
            await self._hook("on_before_resuming_job_steps")
            await self._dispatch_hook(incomplete=False, resuming=True)
        except Exception as error:
            if from_stop:
                await self._restore_stop(previous, error)
            raise ResumeJobFailed(
                f"the resume hook failed: {error}", code=CannotResumeJobError.UNKNOWN
            ) from error
        await self._advance(dispatch_failures_fail=False)
        await self._persist_progress()
        if self.state.status.is_terminal:
            return ResumeJobSuccess.JOB_IS_COMPLETED
        return ResumeJobSuccess.SUCCESS

    async def _restore_stop(self, previous: tuple[Any, ...], error: BaseException) -> None:
        """A failed resume hook of a stopped job: the job goes back to Stopped, as it was."""
        (_, changes, generation, counted, finalized, progress) = previous
        self.state.status_changes = changes
        self.state.execution_generation = generation
        self.state.stopped_steps_counted = counted
        self.state.progress = progress
        self._change(JobStatus.STOPPED, error)
        self.state.stop_finalized = finalized
        try:
            await self._save()
        except Exception as write_error:
            self._release(f"could not restore the stop: {write_error}")
            return
        try:
            await self._hook("on_stopped")
        except Exception:
            self.log.exception("job %s: on_stopped failed", self.id)

    def _reconcile(self, steps: list[JobStepState]) -> dict[int, list[tuple[str, int]]]:
        """Recount progress from stored steps; returns what each stage still has to run."""
        self._counted.clear()
        self._tracked.clear()
        self._waiting.clear()
        outcomes: list[tuple[int, JobStepStatus]] = []
        pending: dict[int, list[tuple[str, int]]] = {}
        for step in steps:
            status = step.status
            if status in (JobStepStatus.COMPLETED_SUCCESSFULLY, JobStepStatus.UNREACHABLE):
                outcomes.append((step.stage, status))
                self._counted.add(step.id)
            elif status in FAILED_STEP_STATUSES:
                if status == JobStepStatus.COMPLETED_WITH_FAILURE and self._would_retry(step):
                    pending.setdefault(step.stage, []).append((step.id, step.attempt + 1))
                else:
                    outcomes.append((step.stage, JobStepStatus.FAILED))
                    self._counted.add(step.id)
            else:
                # Unknown, Scheduled, Running, Stopped: stored state is no proof that it runs.
                pending.setdefault(step.stage, []).append((step.id, max(1, step.attempt)))
        started = [e.stage for e in self.state.progress.stages if e.is_started]
        stage_sizes = {stage: len(ids) for stage, ids in self._stage_steps.items()}
        base = counting.planned(stage_sizes)
        base.message = self.state.progress.message
        self.state.progress = counting.reconcile(base, outcomes, started)
        self._current_stage = None
        self._next_attempt = {
            step_id: attempt
            for stage_pending in pending.values()
            for step_id, attempt in stage_pending
        }
        return pending

    def _would_retry(self, step: JobStepState) -> bool:
        """Whether a stored failed attempt is tried again on resume, by the same rule."""
        outcome = StepOutcome(
            step_id=step.id,
            name=step.name,
            stage=step.stage,
            status=step.status,
            attempt=step.attempt,
            error=step.error,
        )
        return self._allows_retry(outcome, bool(step.error and step.error.non_retryable))
