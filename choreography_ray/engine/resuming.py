"""Resume: from the saved plan or from step storage, never by planning again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ..jobs.errors import (
    CannotResumeJobError,
    CannotRetryFailedError,
    ResumeJobFailed,
    ResumeJobSuccess,
    RetryFailedRefused,
    StartJobError,
    UnreadableStepsError,
)
from ..jobs.state import JobStepProgress, JobStepState, StatusChange
from ..jobs.status import FAILED_STEP_STATUSES, JobStatus, JobStepStatus
from . import progress as counting
from .activation import PREPARE_BATCH, ActivationCore
from .outcomes import Outcomes
from .packed_ids import PlannedIds
from .planning import Plan, StoredPlan
from .record import save_all
from .recount import Recount
from .stages import Stages
from .starting import Starting

T = TypeVar("T")


class Resuming:
    """Resuming a stopped or interrupted job, recounting from storage. The caller holds the
    job's turn."""

    def __init__(
        self,
        core: ActivationCore,
        starting: Starting,
        stages: Stages,
        outcomes: Outcomes,
        recount: Recount,
    ) -> None:
        self.core = core
        self.record = core.record
        self.starting = starting
        self.stages = stages
        self.outcomes = outcomes
        self.recount = recount

    async def resume(
        self, *, before: Callable[[], Awaitable[None]] | None = None
    ) -> ResumeJobSuccess:
        """Resume the job; `before` runs once no refusal stopped the resume, before any of it
        (a caller's resume takes the job out of quarantine there: a refused one changes
        nothing)."""
        state = self.record.state
        status = state.status
        if status.is_terminal:
            return ResumeJobSuccess.JOB_IS_COMPLETED
        if status == JobStatus.REMOVING:
            raise ResumeJobFailed(
                "the job is being removed", code=CannotResumeJobError.JOB_CANNOT_BE_RESUMED
            )
        if state.pending_drain:
            raise ResumeJobFailed(
                "a drain of the job is still pending",
                code=CannotResumeJobError.JOB_CANNOT_BE_RESUMED,
            )
        if status == JobStatus.RUNNING and self.core.ledger.has_work:
            return ResumeJobSuccess.JOB_ALREADY_RUNNING
        if not self.core.job_class.can_resume:
            raise ResumeJobFailed(
                "the job does not allow resuming", code=CannotResumeJobError.JOB_CANNOT_BE_RESUMED
            )
        preparing = status in (
            JobStatus.PREPARING_JOB,
            JobStatus.PREPARING_STEPS,
            JobStatus.STARTING_STEPS,
        )
        if not preparing and status not in (JobStatus.RUNNING, JobStatus.STOPPED):
            raise ResumeJobFailed(
                f"the job is {status.name}", code=CannotResumeJobError.JOB_IS_NOT_PREPARED
            )
        if before is not None:
            await before()
        if preparing:
            return await self._resume_preparation()
        return await self._resume_running(from_stop=status == JobStatus.STOPPED)

    async def _resume_preparation(self) -> ResumeJobSuccess:
        record = self.record
        plan = await self._indexed_plan()
        if plan is None:
            raise ResumeJobFailed(
                "the job has no saved plan: it was interrupted before its plan was saved; "
                "remove it and start it again",
                code=CannotResumeJobError.MISSING_STEP_PLAN,
            )
        sizes = self.core.ledger.stage_sizes()
        if not record.state.progress.total_steps and sizes:
            record.state.progress = counting.planned(sizes)
        if record.state.status == JobStatus.PREPARING_JOB:
            record.change(JobStatus.PREPARING_STEPS)
            await record.save()
        if not sizes:
            await self.outcomes.complete_safely()
            return ResumeJobSuccess.JOB_IS_COMPLETED
        existing = PlannedIds()  # the engine's ids, ascending here, packed in 16 bytes each

        def prepared(steps: list[JobStepState]) -> None:
            for step in steps:
                if step.is_prepared:
                    existing.add(step.id)

        await self._all_steps(self.recount.read(prepared, strict=True))
        await self.stages.locate()
        result = await self.starting.prepare_and_run(plan, existing, clean_start=False)
        if not result.succeeded and result.error not in (
            StartJobError.FAILED_STARTING_SOME_JOB_STEPS,
            StartJobError.ALL_JOB_STEPS_FAILED_STARTING,
        ):
            raise ResumeJobFailed(
                f"resuming the preparation failed: {result.reason or result.error}",
                code=CannotResumeJobError.UNKNOWN,
            )
        return ResumeJobSuccess.SUCCESS

    @staticmethod
    async def _all_steps(loading: Awaitable[T]) -> T:
        """Every step record, or a refusal that leaves the job as it is in storage."""
        try:
            return await loading
        except UnreadableStepsError as error:
            raise ResumeJobFailed(
                f"{error}; fix or remove those records, or remove the job",
                code=CannotResumeJobError.UNREADABLE_STEPS,
            ) from error

    async def _indexed_plan(self) -> Plan | None:
        """The saved plan, its steps told to the ledger; a plan stored apart is read a part
        at a time here and again as its steps are prepared, never held whole."""
        state = self.record.state
        if state.plan is not None:
            plan = list(state.plan)
            self.starting.index_plan(plan)
            return plan
        plans = self.core.ctx.storage.plans
        incarnation = state.stored_step_plan_incarnation
        if not (state.has_stored_step_plan and incarnation) or plans is None:
            return None
        self.starting.index_plan([])
        async for part in plans.plan_parts(self.core.id, incarnation):
            self.starting.index_plan(part, more=True)
        return StoredPlan(incarnation)

    async def rerun(self, step_ids: Sequence[str] | None) -> tuple[str, ...]:
        """Run the job's failed steps again (every one, or those of `step_ids`) under their
        identities, in a new execution generation, each from its first attempt; successes stay
        as stored. A stopped job resumes as well: its unfinished steps run too. Returns the
        failed steps that run again. A refusal (`RetryFailedRefused`) changes nothing.

        The steps to run again are written with the Running that begins it
        (`JobState.rerun_steps`), before any step record changes: a crash in between leaves a
        Running job that recovery resumes, resetting those records first (`_reset_reruns`)."""
        record = self.record
        state = record.state
        status = state.status
        stop_finished = (
            status == JobStatus.STOPPED and state.stop_finalized and not state.pending_drain
        )
        if status != JobStatus.COMPLETED_WITH_FAILURES and not stop_finished:
            raise RetryFailedRefused(
                f"the job is {status.name}: only a job completed with failures, or stopped "
                "with its stop finished, runs its failed steps again",
                code=CannotRetryFailedError.JOB_IS_NOT_FINISHED,
            )
        if not self.core.job_class.can_resume:
            raise RetryFailedRefused(
                "the job does not allow resuming",
                code=CannotRetryFailedError.JOB_CANNOT_BE_RESUMED,
            )
        failed: list[str] = []
        unreachable: list[str] = []

        def note(steps: list[JobStepState]) -> None:
            for step in steps:
                if step.status in FAILED_STEP_STATUSES:
                    failed.append(step.id)
                elif step.status == JobStepStatus.UNREACHABLE:
                    unreachable.append(step.id)

        try:
            await self.recount.read(note, strict=True)
        except UnreadableStepsError as error:
            raise RetryFailedRefused(
                f"{error}; fix or remove those records first",
                code=CannotRetryFailedError.UNREADABLE_STEPS,
            ) from error
        chosen = failed
        if step_ids is not None:
            chosen = list(dict.fromkeys(step_ids))
            known = set(failed)
            others = [step_id for step_id in chosen if step_id not in known]
            if others:
                shown = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
                raise RetryFailedRefused(
                    f"not a failed step of job {self.core.id}: {shown}",
                    code=CannotRetryFailedError.NOT_A_FAILED_STEP,
                )
        if not chosen:
            raise RetryFailedRefused(
                f"job {self.core.id} has no failed steps",
                code=CannotRetryFailedError.NO_FAILED_STEPS,
            )
        # Steps a failed stage left unreachable run again too: whether they may is decided
        # again, once the steps run again have their outcomes.
        state.rerun_steps = [*chosen, *unreachable]
        state.execution_generation += 1
        state.stop_finalized = False
        state.stopped_steps_counted = []
        if self.core.ctx.owner is not None:
            state.owner = self.core.ctx.owner  # a finished job has no owner to ask
        record.change(JobStatus.RUNNING)
        try:
            await record.save()
        except Exception as error:
            record.release(f"could not write Running: {error}")
            raise RetryFailedRefused(
                f"could not write Running: {error}", code=CannotRetryFailedError.UNKNOWN
            ) from error
        await self._resume_running(from_stop=False, rerun=True)
        return tuple(chosen)

    async def _reset_reruns(self) -> None:
        """Make the records of `JobState.rerun_steps` steps to run, from their first attempt,
        in this generation. Only a record still holding an outcome of an earlier generation
        is reset, so a reset done again after a crash changes nothing more."""
        state = self.record.state
        ids = state.rerun_steps
        if not ids:
            return
        try:
            await self._reset(ids)
        except Exception as error:
            # Running and the steps to run again are stored: recovery resets them and runs
            # the job (the manager brings back an activation let go for a reason).
            self.record.release(f"could not reset the steps to run again: {error}")
            raise RetryFailedRefused(
                f"could not reset the steps to run again ({error}); the job's recovery runs them",
                code=CannotRetryFailedError.UNKNOWN,
            ) from error
        state.rerun_steps = []

    async def _reset(self, ids: list[str]) -> None:
        storage = self.core.ctx.storage.steps
        generation = self.record.state.execution_generation
        now = self.core.ctx.clock.now()
        for offset in range(0, len(ids), PREPARE_BATCH):
            records = await storage.get_many(self.core.id, ids[offset : offset + PREPARE_BATCH])
            reset = [
                step.model_copy(
                    update={
                        "status": JobStepStatus.SCHEDULED,
                        "status_changes": [
                            *step.status_changes,
                            StatusChange(status=int(JobStepStatus.SCHEDULED), occurred=now),
                        ],
                        "progress": JobStepProgress(),
                        "attempt": 1,
                        "generation": generation,
                        "lease": None,
                        "result": None,
                        "error": None,
                        "decision": None,
                    }
                )
                for step in records
                if step.generation < generation
                and (
                    step.status in FAILED_STEP_STATUSES or step.status == JobStepStatus.UNREACHABLE
                )
            ]
            await save_all(storage, reset)

    async def _resume_running(self, *, from_stop: bool, rerun: bool = False) -> ResumeJobSuccess:
        """Recount and run what is unfinished; `rerun`: Running was written by `rerun`."""
        record = self.record
        state = record.state
        previous = (
            state.status,
            state.status_changes,
            state.execution_generation,
            state.stopped_steps_counted,
            state.stop_finalized,
            state.progress,
        )
        # The seed's eligibility for compensating a failed hook: entered as Stopped, no pending
        # drain (refused above), and the pre-resume accounting says every worker reported.
        # Otherwise work may still be live, and going back to Stopped would hide it.
        compensable = from_stop and state.progress.is_stopped
        await self._reset_reruns()
        await self._all_steps(self.recount.load(strict=True))
        await self.stages.locate()
        if from_stop:
            state.execution_generation += 1
            state.stop_finalized = False
        state.stopped_steps_counted = []
        if not rerun:
            record.change(JobStatus.RUNNING)
        try:
            await record.save()
        except Exception as error:
            record.release(f"could not write Running: {error}")
            raise ResumeJobFailed(
                f"could not write Running: {error}", code=CannotResumeJobError.UNKNOWN
            ) from error
        if state.progress.is_completed:
            await self.outcomes.complete()
            return ResumeJobSuccess.JOB_IS_COMPLETED
        try:
            await self.core.hook("on_before_resuming_job_steps")
            await self.core.dispatch_hook(incomplete=False, resuming=True)
        except Exception as error:
            if compensable:
                await self._restore_stop(previous, error)
            raise ResumeJobFailed(
                f"the resume hook failed: {error}", code=CannotResumeJobError.UNKNOWN
            ) from error
        self.stages.retry_due()  # a stored failure waits out its stored retry time
        await self.stages.advance(dispatch_failures_fail=False)
        await record.save_progress()
        if state.status.is_terminal:
            return ResumeJobSuccess.JOB_IS_COMPLETED
        return ResumeJobSuccess.SUCCESS

    async def _restore_stop(self, previous: tuple[Any, ...], error: BaseException) -> None:
        """A failed resume hook of a stopped job: the job goes back to Stopped, as it was."""
        record = self.record
        state = record.state
        (_, changes, generation, counted, finalized, progress) = previous
        state.status_changes = changes
        state.execution_generation = generation
        state.stopped_steps_counted = counted
        state.progress = progress
        record.change(JobStatus.STOPPED, error)
        state.stop_finalized = finalized
        try:
            await record.save()
        except Exception as write_error:
            record.release(f"could not restore the stop: {write_error}")
            return
        try:
            await self.core.hook("on_stopped")
        except Exception:
            self.core.log.exception("job %s: on_stopped failed", self.core.id)
