"""Starting a job: plan, save the plan, prepare the steps, enter Running."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from ..jobs.errors import (
    StartJobError,
    VersionConflictError,
)
from ..jobs.registry import TypeKind
from ..jobs.state import JobStepState, PlannedStep
from ..jobs.status import (
    JobStatus,
)
from . import progress as counting
from .activation import (
    PREPARE_BATCH,
    JobStartResult,
    Released,
    _stage_sizes,
)
from .context import error_messages, maybe_await
from .planning import InvalidPlan, build_plan, plan_size


class Starting:
    """The start of a job's life, up to its first dispatch."""

    # -- start ----------------------------------------------------------------------------------

    async def start(self, request: BaseModel) -> JobStartResult:
        async with self._turn:
            return await self._start(request)

    async def _start(self, request: BaseModel) -> JobStartResult:
        if self.state.status != JobStatus.NONE or self.state.version:
            if self.state.status.is_terminal:
                return JobStartResult(self.id, StartJobError.ALREADY_COMPLETED)
            return JobStartResult(self.id, StartJobError.ALREADY_BEEN_PREPARED)
        if not isinstance(request, self.job_class.request_type):
            raise TypeError(
                f"{self.job_class.__qualname__} takes a "
                f"{self.job_class.request_type.__qualname__} request, got "
                f"{type(request).__qualname__}"
            )
        registry = self.ctx.registry
        self.state.created = self.ctx.clock.now()
        self.state.request = registry.dump(request)
        self.state.execution_generation = 1
        try:
            self.state.details = self.job.details(request) or ""
        except Exception:
            self.log.exception("job %s: details() failed", self.id)
        self._change(JobStatus.PREPARING_JOB)
        try:
            await self._save()
        except VersionConflictError:
            return JobStartResult(self.id, StartJobError.ALREADY_BEEN_PREPARED)
        except Exception as error:
            self._release("the job could not be written")
            return JobStartResult(
                self.id, StartJobError.UNKNOWN, f"could not save the job: {error}"
            )

        try:
            details = list(await maybe_await(self.job.prepare_steps(request)))
        except Exception as error:
            return await self._fail_start(error, StartJobError.UNKNOWN)
        try:
            plan = build_plan(details, registry)
        except InvalidPlan as invalid:
            return await self._fail_start(invalid.reason, StartJobError.INVALID_STEP_PLAN)
        self._originals = {detail.step_id: detail.request for detail in details}

        try:
            await self._save_plan(plan)
        except Released:
            return JobStartResult(self.id, StartJobError.UNKNOWN, "the job could not be written")
        except Exception as error:
            return await self._fail_start(error, StartJobError.UNKNOWN)
        if not plan:
            await self._complete_safely()
            return JobStartResult(self.id, StartJobError.NO_JOB_STEPS_TO_START)
        if self.job_class.start_steps_in_background:
            self._spawn(self._continue_in_background(plan))
            return JobStartResult(self.id)
        return await self._prepare_and_run(plan, existing=set(), clean_start=True)

    async def _continue_in_background(self, plan: list[PlannedStep]) -> None:
        async with self._turn:
            if self.released or self.state.status != JobStatus.PREPARING_STEPS:
                return
            result = await self._prepare_and_run(plan, existing=set(), clean_start=True)
            if not result.succeeded:
                self.log.warning(
                    "job %s: starting its steps in the background failed: %s %s",
                    self.id,
                    result.error.name if result.error is not None else "",
                    result.reason,
                )

    async def _save_plan(self, plan: list[PlannedStep]) -> None:
        """Save the complete plan and move to PreparingSteps, inline or in plan storage."""
        self._index_plan(plan)
        self.state.progress = counting.planned(_stage_sizes(plan))
        plans = self.ctx.storage.plans
        limit = self.ctx.options.max_inline_step_plan_size
        external = (
            plans is not None
            and self.ctx.externalize_plans
            and plan
            and (limit == 0 or plan_size(plan) > limit)
        )
        if external:
            assert plans is not None
            incarnation = (self.state.stored_step_plan_incarnation or 0) + 1
            self.state.stored_step_plan_incarnation = incarnation
            await self._save()  # the fence: the incarnation is durable before any plan record
            await plans.save_plan(self.id, incarnation, plan)
            self.state.has_stored_step_plan = True
            self.state.plan = None
        else:
            self.state.plan = plan
        self._change(JobStatus.PREPARING_STEPS)
        await self._save()

    async def _fail_start(self, error: BaseException | str, code: StartJobError) -> JobStartResult:
        """Write the job Failed with the reason and without its plan."""
        reason = error if isinstance(error, str) else "; ".join(error_messages(error))
        incarnation = (
            self.state.stored_step_plan_incarnation if self.state.has_stored_step_plan else None
        )
        self.state.plan = None
        self.state.has_stored_step_plan = False
        self._change(JobStatus.FAILED, error)
        try:
            await self._save()
        except Exception as write_error:
            # Not durable: let go and keep whatever plan is stored, for recovery.
            self._release(f"could not write Failed: {write_error}")
            return JobStartResult(self.id, StartJobError.UNKNOWN, reason)
        if incarnation is not None:
            await self._delete_plan(incarnation)
        return JobStartResult(self.id, code, reason)

    async def _delete_plan(self, incarnation: int) -> None:
        plans = self.ctx.storage.plans
        if plans is None:
            return
        try:
            await plans.delete_plan(self.id, incarnation)
        except Exception:
            self.log.exception("job %s: could not delete plan incarnation %s", self.id, incarnation)

    def _index_plan(self, plan: Iterable[PlannedStep]) -> None:
        self._stage_steps = {}
        for step in plan:
            self._stage_steps.setdefault(step.stage, []).append(step.step_id)
            self._stage_of[step.step_id] = step.stage
            self._names[step.step_id] = step.name
        self._loaded = True

    def _index_steps(self, steps: Iterable[JobStepState]) -> None:
        self._stage_steps = {}
        for step in steps:
            self._stage_steps.setdefault(step.stage, []).append(step.id)
            self._stage_of[step.id] = step.stage
            self._names[step.id] = step.name
        self._loaded = True

    async def _prepare_and_run(
        self, plan: list[PlannedStep], existing: set[str], *, clean_start: bool
    ) -> JobStartResult:
        try:
            failed = await self._prepare_steps(plan, existing)
        except Released:
            return JobStartResult(self.id, StartJobError.UNKNOWN, "the job could not be written")
        except Exception as error:
            return await self._fail_start(error, StartJobError.UNKNOWN)
        if failed is not None:
            result = await self._fail_start(failed, StartJobError.COULD_NOT_PREPARE_JOB_STEPS)
            if result.error == StartJobError.COULD_NOT_PREPARE_JOB_STEPS:
                try:
                    await self._hook("on_failed_to_prepare")
                except Exception:
                    self.log.exception("job %s: on_failed_to_prepare failed", self.id)
            return result
        try:
            if self.state.status != JobStatus.STARTING_STEPS:
                self._change(JobStatus.STARTING_STEPS)
                await self._save()
            if clean_start:
                await self._hook("on_before_starting_job_steps")
        except Released:
            return JobStartResult(self.id, StartJobError.UNKNOWN, "the job could not be written")
        except Exception as error:
            return await self._fail_start(error, StartJobError.UNKNOWN)
        return await self._enter_running(
            incomplete=not clean_start, resuming=not clean_start, fresh=True
        )

    async def _prepare_steps(self, plan: list[PlannedStep], existing: set[str]) -> str | None:
        """Prepare and store every planned step not stored yet. Returns a failure reason.

        On a clean start the requests `prepare_steps` returned are used as they are (the plan
        check proved they read back equal); recovery reads them from the saved plan.
        """
        registry = self.ctx.registry
        originals, self._originals = self._originals, {}
        steps: dict[str, Any] = {}
        batch: list[JobStepState] = []
        for planned in plan:
            if planned.step_id in existing:
                continue
            try:
                step = steps.get(planned.step_type)
                if step is None:
                    step = steps[planned.step_type] = registry.resolve(
                        planned.step_type, TypeKind.STEP
                    )()
                request = originals.get(planned.step_id)
                if request is None:
                    request = registry.load(planned.request, TypeKind.REQUEST)
                user_state = step.initialize_state(request)
                state_payload = registry.dump(user_state)
            except Exception as error:
                return (
                    f"step {planned.step_id!r} ({planned.step_type}) could not be prepared: "
                    f"{'; '.join(error_messages(error))}"
                )
            batch.append(
                JobStepState.prepared(
                    id=planned.step_id,
                    job_id=self.id,
                    type=planned.step_type,
                    name=planned.name,
                    stage=planned.stage,
                    state=state_payload,
                )
            )
            if len(batch) >= PREPARE_BATCH:
                await self._store_prepared(batch)
                batch = []
        if batch:
            await self._store_prepared(batch)
        return None

    async def _store_prepared(self, batch: list[JobStepState]) -> None:
        self.counters.step_batches += 1
        self.counters.step_rows += len(batch)
        try:
            await self.ctx.storage.steps.save_many(batch)
        except VersionConflictError as conflict:
            # Already stored by an earlier, interrupted preparation: keep those records.
            lost = set(conflict.conflicts)
            rest = [
                s
                for s in batch
                if s.id not in lost and s.id not in conflict.__dict__.get("applied", {})
            ]
            if rest:
                await self._store_prepared(rest)

    async def _enter_running(
        self, *, incomplete: bool, resuming: bool, fresh: bool
    ) -> JobStartResult:
        try:
            await self._dispatch_hook(incomplete=incomplete, resuming=resuming)
        except Exception as error:
            return await self._fail_start(error, StartJobError.UNKNOWN)
        incarnation_kept = self.state.stored_step_plan_incarnation
        self.state.plan = None
        self.state.has_stored_step_plan = False
        self.state.stored_step_plan_incarnation = incarnation_kept
        self._change(JobStatus.RUNNING)
        try:
            await self._save()
        except Exception as error:
            self._release(f"could not write Running: {error}")
            return JobStartResult(
                self.id, StartJobError.UNKNOWN, f"could not write Running: {error}"
            )
        try:
            failed = await self._advance(dispatch_failures_fail=fresh)
            await self._persist_progress()
        except Exception as error:
            self._release(f"moving the job on failed: {error}")
            return JobStartResult(
                self.id,
                StartJobError.UNKNOWN,
                f"the job is Running but its progress could not be saved ({error}); "
                "it continues from storage when it is next activated",
            )
        if (
            failed
            and failed == self.state.progress.total_steps - self.state.progress.unreachable_steps
        ):
            return JobStartResult(
                self.id, StartJobError.ALL_JOB_STEPS_FAILED_STARTING, failed_steps=()
            )
        if failed:
            return JobStartResult(self.id, StartJobError.FAILED_STARTING_SOME_JOB_STEPS)
        return JobStartResult(self.id)
