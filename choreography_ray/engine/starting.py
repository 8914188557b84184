"""Starting a job: plan, save the plan, prepare the steps, enter Running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Container, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ..jobs.concurrency import check_key
from ..jobs.errors import (
    ChoreographyError,
    InvalidOptionError,
    InvalidRequestError,
    NoEligibleJobWorker,
    StartJobError,
    VersionConflictError,
)
from ..jobs.job import StepDetails
from ..jobs.registry import TypeKind
from ..jobs.state import JobStepState, PlannedStep
from ..jobs.status import JobStatus
from ..storage.protocols import StepPlanStorage
from . import progress as counting
from .activation import PREPARE_BATCH, ActivationCore, JobStartResult
from .context import error_messages, maybe_await
from .outcomes import Outcomes
from .planning import (
    ORIGINALS_KEPT,
    InvalidPlan,
    Plan,
    StoredPlan,
    draw,
    plan_exceeds,
    plan_parts,
    plan_size,
)
from .record import Released
from .stages import Stages


@dataclass(frozen=True)
class StartSettings:
    """What a start sets beside its request; None takes the job class's."""

    priority: int | None = None
    concurrency_key: str | None = None


DEFAULT_START = StartSettings()


class Starting:
    """The start of a job's life, up to its first dispatch; also the preparation a resume
    finishes after a crash (`prepare_and_run`)."""

    def __init__(self, core: ActivationCore, stages: Stages, outcomes: Outcomes) -> None:
        self.core = core
        self.record = core.record
        self.ledger = core.ledger
        self.stages = stages
        self.outcomes = outcomes
        self._originals: dict[str, BaseModel] = {}
        """The requests `prepare_steps` returned, used as they are for the steps of this start."""

    @property
    def id(self) -> str:
        return self.core.id

    async def start(
        self,
        request: BaseModel,
        steps: Iterable[StepDetails] | None = None,
        max_active_steps: int | None = None,
        settings: StartSettings = DEFAULT_START,
    ) -> JobStartResult:
        """Start the job with `request`; the caller holds the job's turn. `steps`, when
        given, are the job's steps instead of what `prepare_steps` returns (`jobs.map`'s
        items); `max_active_steps` is this job's window, stored with it; `settings` its
        priority and concurrency key (None: the class's)."""
        record = self.record
        state = record.state
        job_class = self.core.job_class
        if state.status != JobStatus.NONE or state.version:
            if state.status.is_terminal:
                return JobStartResult(self.id, StartJobError.ALREADY_COMPLETED)
            return JobStartResult(self.id, StartJobError.ALREADY_BEEN_PREPARED)
        if not isinstance(request, job_class.request_type):
            raise TypeError(
                f"{job_class.__qualname__} takes a "
                f"{job_class.request_type.__qualname__} request, got "
                f"{type(request).__qualname__}"
            )
        concurrency = job_class.concurrency
        if settings.concurrency_key is not None and concurrency is None:
            raise InvalidOptionError(
                "concurrency_key",
                f"{job_class.__qualname__} has no concurrency limit to keep "
                "(set its `concurrency = ConcurrencyKey(...)`)",
            )
        state.priority = job_class.priority if settings.priority is None else settings.priority
        if settings.concurrency_key is not None:
            state.concurrency_key = check_key(settings.concurrency_key)
        elif concurrency is not None:
            state.concurrency_key = concurrency.of(request)
        registry = self.core.ctx.registry
        state.created = self.core.ctx.clock.now()
        state.request = registry.dump_request(request)
        state.execution_generation = 1
        if max_active_steps is not None:
            state.max_active_steps = max_active_steps
            self.core.window = max_active_steps
        try:
            state.details = self.core.job.details(request) or ""
        except Exception:
            self.core.log.exception("job %s: details() failed", self.id)
        record.change(JobStatus.PREPARING_JOB)
        try:
            await record.save()
        except VersionConflictError:
            return JobStartResult(self.id, StartJobError.ALREADY_BEEN_PREPARED)
        except Exception as error:
            record.release("the job could not be written")
            return JobStartResult(
                self.id, StartJobError.UNKNOWN, f"could not save the job: {error}"
            )

        originals: dict[str, BaseModel] = {}
        try:
            if steps is None:
                steps = await maybe_await(self.core.job.prepare_steps(request))
            parts = plan_parts(steps, registry, originals)  # consumes steps
            del steps
            self._originals = originals
            plan = await self._save_plan(parts)
        except Released:
            return JobStartResult(self.id, StartJobError.UNKNOWN, "the job could not be written")
        except InvalidPlan as invalid:
            return await self.fail(invalid.reason, StartJobError.INVALID_STEP_PLAN)
        except InvalidRequestError as error:  # an item a step function cannot take
            return await self.fail(error, StartJobError.INVALID_STEP_PLAN)
        except Exception as error:
            return await self.fail(error, StartJobError.UNKNOWN)
        if not plan:
            await self.outcomes.complete_safely()
            return JobStartResult(self.id, StartJobError.NO_JOB_STEPS_TO_START)
        if job_class.start_steps_in_background:
            self.core.spawn(self._continue_in_background(plan))
            return JobStartResult(self.id)
        return await self.prepare_and_run(plan, existing=set(), clean_start=True)

    async def _continue_in_background(self, plan: Plan) -> None:
        async with self.core.turn:
            if self.record.released or self.record.state.status != JobStatus.PREPARING_STEPS:
                return
            result = await self.prepare_and_run(plan, existing=set(), clean_start=True)
            if not result.succeeded:
                self.core.log.warning(
                    "job %s: starting its steps in the background failed: %s %s",
                    self.id,
                    result.error.name if result.error is not None else "",
                    result.reason,
                )

    def index_plan(self, plan: list[PlannedStep], *, more: bool = False) -> None:
        """Tell the ledger the plan's steps; `more`: a later part of a plan being indexed."""
        self.ledger.index(
            ((step.step_id, step.stage, step.name, step.step_type) for step in plan), more=more
        )

    async def _save_plan(self, parts: Iterator[list[PlannedStep]]) -> Plan:
        """Save the complete plan and move to PreparingSteps, inline or in plan storage.

        A plan of up to `ORIGINALS_KEPT` steps is held whole until its steps are prepared. A
        larger one is saved as it is built, a part at a time, and each part is let go once
        saved: a plan of a million steps never exists whole in memory (its steps are then
        prepared from plan storage). Where it cannot be stored apart, it is held whole."""
        record = self.record
        state = record.state
        plan, more = draw(parts, ORIGINALS_KEPT)
        ctx = self.core.ctx
        plans = ctx.storage.plans
        limit = ctx.options.max_inline_step_plan_size
        large = bool(plan) and (limit == 0 or plan_exceeds(plan, limit))
        external = plans is not None and ctx.externalize_plans and large
        held_inline = False
        if external and ctx.plans_apart is not None and not await ctx.plans_apart(state.type):
            external, held_inline = False, True  # a host of an older release could not read it
        if more and not external:
            plan.extend(planned for part in parts for planned in part)
            more = False
        self.index_plan(plan)
        saved: Plan = plan
        if external:
            assert plans is not None
            incarnation = (state.stored_step_plan_incarnation or 0) + 1
            state.stored_step_plan_incarnation = incarnation
            await record.save()  # the fence: the incarnation is durable before any plan record
            await plans.save_plan(self.id, incarnation, plan)
            if more:
                saved = await self._save_parts(plans, incarnation, plan, parts)
            state.has_stored_step_plan = True
            state.plan = None
        else:
            state.plan = plan
        state.progress = counting.planned(self.ledger.stage_sizes())
        record.change(JobStatus.PREPARING_STEPS)
        try:
            await record.save()
        except (Released, VersionConflictError):
            raise
        except Exception as error:
            if not held_inline:
                raise
            raise ChoreographyError(
                f"the plan ({plan_size(plan)} bytes) must stay in the job record while a host "
                f"of an older release runs job type {state.type!r}, and the record could not "
                f"be written with it: {error}"
            ) from error
        return saved

    async def _save_parts(
        self,
        plans: StepPlanStorage,
        incarnation: int,
        head: list[PlannedStep],
        parts: Iterator[list[PlannedStep]],
    ) -> StoredPlan:
        """Save the rest of a plan whose `head` is saved, a part at a time as it is built."""
        position = len(head)
        head.clear()
        for part in parts:
            self.index_plan(part, more=True)
            await plans.append_plan(self.id, incarnation, position, part)
            position += len(part)
            await asyncio.sleep(0)  # a SQLite part is written inline: let the loop answer
        return StoredPlan(incarnation)

    async def fail(self, error: BaseException | str, code: StartJobError) -> JobStartResult:
        """Write the job Failed with the reason and without its plan."""
        record = self.record
        state = record.state
        reason = error if isinstance(error, str) else "; ".join(error_messages(error))
        # Also a plan of this incarnation partly saved, when building its later parts failed.
        incarnation = state.stored_step_plan_incarnation
        state.plan = None
        state.has_stored_step_plan = False
        record.change(JobStatus.FAILED, error)
        try:
            await record.save()
        except Exception as write_error:
            # Not durable: let go and keep whatever plan is stored, for recovery.
            record.release(f"could not write Failed: {write_error}")
            return JobStartResult(self.id, StartJobError.UNKNOWN, reason)
        if incarnation is not None:
            await record.delete_plan(incarnation)
        return JobStartResult(self.id, code, reason)

    async def prepare_and_run(
        self, plan: Plan, existing: Container[str], *, clean_start: bool
    ) -> JobStartResult:
        """Prepare every planned step not in `existing`, then enter Running and dispatch."""
        if clean_start and not self.core.ctx.options.worker_wait_timeout:
            try:
                # The placement spec's first moment: no worker qualifies as steps are prepared.
                await self.core.ctx.dispatcher.check_placement(
                    self.core.ctx.key, self.record.state.type, self.ledger.types.names()
                )
            except NoEligibleJobWorker as error:
                return await self.fail(error, StartJobError.UNKNOWN)
        try:
            failed = await self._prepare_steps(plan, existing)
        except Released:
            return JobStartResult(self.id, StartJobError.UNKNOWN, "the job could not be written")
        except Exception as error:
            return await self.fail(error, StartJobError.UNKNOWN)
        if failed is not None:
            result = await self.fail(failed, StartJobError.COULD_NOT_PREPARE_JOB_STEPS)
            if result.error == StartJobError.COULD_NOT_PREPARE_JOB_STEPS:
                try:
                    await self.core.hook("on_failed_to_prepare")
                except Exception:
                    self.core.log.exception("job %s: on_failed_to_prepare failed", self.id)
            return result
        try:
            if self.record.state.status != JobStatus.STARTING_STEPS:
                # In the history, not written by itself: the Running write carries it. Stored
                # PreparingSteps and StartingSteps recover alike (the plan is reused, missing
                # steps prepared, initialization ensured; the start hook is never replayed), so
                # a write of its own bought nothing but a commit per start (decisions.md).
                self.record.change(JobStatus.STARTING_STEPS)
            if clean_start:
                await self.core.hook("on_before_starting_job_steps")
        except Released:
            return JobStartResult(self.id, StartJobError.UNKNOWN, "the job could not be written")
        except Exception as error:
            return await self.fail(error, StartJobError.UNKNOWN)
        return await self._enter_running(resuming=not clean_start)

    async def _prepare_steps(self, plan: Plan, existing: Container[str]) -> str | None:
        """Prepare and store every planned step not stored yet. Returns a failure reason.

        On a clean start the requests `prepare_steps` returned are used as they are (the plan
        check proved they read back equal); recovery reads them from the saved plan.
        """
        registry = self.core.ctx.registry
        originals, self._originals = self._originals, {}
        steps: dict[str, Any] = {}
        batch: list[JobStepState] = []
        async for index, planned in self._entries(plan):
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
                if step.concurrency is not None:  # a key that cannot be read fails here
                    step.concurrency.of(user_state)
                # A step whose state is its request as it is (`state_is_request`: a step
                # function's item) stores the plan's payload of it, which planning proved to be
                # what dumping it gives.
                if user_state is request and step.state_is_request:
                    state_payload = planned.request
                else:
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
                    position=index,
                )
            )
            if len(batch) >= PREPARE_BATCH:
                await self._store_prepared(batch)
                batch = []
                # A SQLite batch is written inline and awaiting it does not suspend: without
                # this, preparing 100,000 steps held the loop for seconds, and the answer of
                # the `start()` that had returned waited behind it (5.3 s against 1.2 s on
                # PostgreSQL, whose writes suspend).
                await asyncio.sleep(0)
        if batch:
            await self._store_prepared(batch)
        return None

    async def _entries(self, plan: Plan) -> AsyncIterator[tuple[int, PlannedStep]]:
        """The plan's entries with their positions: from plan storage a part at a time, or
        from the list held, each let go once handed out when the list is this start's own (a
        plan stored apart; an inline plan is the job record's)."""
        if isinstance(plan, StoredPlan):
            plans = self.core.ctx.storage.plans
            assert plans is not None
            position = 0
            async for part in plans.plan_parts(self.id, plan.incarnation):
                for planned in part:
                    yield position, planned
                    position += 1
            return
        owned = self.record.state.plan is not plan
        for index in range(len(plan)):
            planned = plan[index]
            if owned:
                plan[index] = None  # type: ignore[call-overload]
            yield index, planned

    async def _store_prepared(self, batch: list[JobStepState]) -> None:
        counters = self.core.counters
        counters.step_batches += 1
        counters.step_rows += len(batch)
        try:
            versions = await self.core.ctx.storage.steps.save_many(batch)
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
            return
        self.ledger.keep_fresh(batch, versions)

    async def _enter_running(self, *, resuming: bool) -> JobStartResult:
        """Write Running and dispatch. A start that reaches no worker fails its steps on a clean
        start; when recovery finishes a preparation it is sent again (see `Stages`)."""
        record = self.record
        state = record.state
        try:
            await self.core.dispatch_hook(incomplete=resuming, resuming=resuming)
        except Exception as error:
            return await self.fail(error, StartJobError.UNKNOWN)
        state.plan = None
        state.has_stored_step_plan = False
        record.change(JobStatus.RUNNING)
        try:
            await record.save()
        except Exception as error:
            record.release(f"could not write Running: {error}")
            return JobStartResult(
                self.id, StartJobError.UNKNOWN, f"could not write Running: {error}"
            )
        try:
            failed = await self.stages.advance(dispatch_failures_fail=not resuming)
            await record.save_progress()
        except Exception as error:
            record.release(f"moving the job on failed: {error}")
            return JobStartResult(
                self.id,
                StartJobError.UNKNOWN,
                f"the job is Running but its progress could not be saved ({error}); "
                "it continues from storage when it is next activated",
            )
        progress = state.progress
        if failed and failed == progress.total_steps - progress.unreachable_steps:
            return JobStartResult(
                self.id, StartJobError.ALL_JOB_STEPS_FAILED_STARTING, failed_steps=()
            )
        if failed:
            return JobStartResult(self.id, StartJobError.FAILED_STARTING_SOME_JOB_STEPS)
        return JobStartResult(self.id)
