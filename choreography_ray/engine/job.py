"""A job's live activation: the lifecycle as an async state machine over storage and dispatch.

Durability contract (storage is the truth):
- the job is written PreparingJob before `prepare_steps` runs;
- the complete plan is saved before any step is prepared;
- steps are prepared and stored, in batches, with their planned identities;
- Running is written (dropping the inline plan) before the first step is dispatched;
- a step's outcome is persisted by its worker before the job hears of it, so the job's progress
  is a cache of step storage: a new activation recounts it from the steps.

One turn at a time: every operation and every batch of reports runs under the activation's
turn lock, so two calls never interleave on the job's state. Reports are queued and handled in
the job's own turn, so a step reporting while the job calls its worker cannot deadlock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, RootModel

from ..jobs.errors import (
    CannotResumeJobError,
    NoEligibleJobWorker,
    RemoveJobError,
    RemoveJobFailed,
    ResumeJobFailed,
    ResumeJobSuccess,
    StartJobError,
    StopJobError,
    StopJobFailed,
    VersionConflictError,
)
from ..jobs.job import Job, JobInfo, JobStageFailureBehavior, JobStepDispatchContext, StepOutcome
from ..jobs.registry import Payload, TypeKind
from ..jobs.state import JobState, JobStepState, PlannedStep, StatusChange
from ..jobs.status import (
    FAILED_STEP_STATUSES,
    RUNNING_JOB_STATUSES,
    JobStatus,
    JobStepStatus,
)
from . import progress as counting
from .context import EngineContext, error_messages, maybe_await
from .messages import StartOutcome, StartResult, StepReport, StepStart, StopRequest
from .planning import InvalidPlan, build_plan, plan_size

log = logging.getLogger("choreography_ray.engine")

PREPARE_BATCH = 1000
DISPATCH_BATCH = 1000


@dataclass(frozen=True)
class JobStartResult:
    """How a start went. `error` is None on success; NO_JOB_STEPS_TO_START is not a failure."""

    job_id: str
    error: StartJobError | None = None
    reason: str = ""
    failed_steps: tuple[str, ...] = ()

    @property
    def succeeded(self) -> bool:
        return self.error in (None, StartJobError.NO_JOB_STEPS_TO_START)


@dataclass
class _Tracked:
    stage: int
    attempt: int
    generation: int


@dataclass
class _Counters:
    reports: int = 0
    ignored_reports: int = 0
    dispatched: int = 0
    job_writes: int = 0
    step_batches: int = 0
    step_rows: int = 0
    hook_errors: list[str] = field(default_factory=list)


class Released(Exception):
    """The activation can no longer trust its copy of the job and has let it go."""


class JobActivation:
    """The one live activation of one job."""

    def __init__(
        self,
        ctx: EngineContext,
        job_class: type[Job[Any]],
        state: JobState,
        *,
        on_release: Any = None,
    ) -> None:
        self.ctx = ctx
        self.job_class = job_class
        self.state = state
        self.job = job_class()
        self.job.info = JobInfo(id=state.id, key=state.key, status=state.status)
        self._on_release = on_release
        self._hears_outcomes = (
            job_class.on_step_completed_or_stopped is not Job.on_step_completed_or_stopped
        )
        self.log = logging.LoggerAdapter(log, {"job_id": state.id, "step_id": "-"})
        self._turn = asyncio.Lock()
        self._inbox: list[StepReport] = []
        self._drain_task: asyncio.Task[None] | None = None
        self._stage_steps: dict[int, list[str]] = {}
        self._stage_of: dict[str, int] = {}
        self._names: dict[str, str] = {}
        self._tracked: dict[str, _Tracked] = {}
        self._waiting: deque[tuple[str, int]] = deque()
        self._counted: set[str] = set()
        self._next_attempt: dict[str, int] = {}
        self._originals: dict[str, BaseModel] = {}
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._current_stage: int | None = None
        self._loaded = False
        self.released = False
        self.release_reason = ""
        """Why the activation let go of the job; empty when it finished normally."""
        self.counters = _Counters()
        self._background: set[asyncio.Task[Any]] = set()

    # -- small helpers ------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self.state.id

    @property
    def _window(self) -> int | None:
        return self.job_class.max_active_steps or self.ctx.options.max_active_steps_per_job

    @property
    def _max_attempts(self) -> int:
        return self.job_class.max_step_attempts or self.ctx.options.max_step_attempts

    def _change(self, status: JobStatus, error: BaseException | str | None = None) -> None:
        messages: list[str] = []
        trace = ""
        if isinstance(error, BaseException):
            messages = error_messages(error)
            trace = "".join(traceback.format_exception(error))
        elif error:
            messages = [error]
        self.state.status = status
        self.state.status_changes = [
            *self.state.status_changes,
            StatusChange(
                status=int(status),
                occurred=self.ctx.clock.now(),
                exception_messages=messages,
                exception_stack_trace=trace,
            ),
        ]
        self.job.info.status = status
        self.job.info.progress = self.state.progress
        if self.ctx.on_status is not None:
            self.ctx.on_status(status)

    async def _save(self) -> None:
        """Compare-and-set the job record; a lost race means another activation owns the job."""
        try:
            self.state.version = await self.ctx.storage.jobs.save(self.state)
        except VersionConflictError:
            self._release("the job changed in storage under this activation")
            raise
        self.counters.job_writes += 1

    def _release(self, reason: str) -> None:
        if not self.released:
            self.log.warning("job %s: activation released: %s", self.id, reason)
            self.released = True
            self.release_reason = reason
            for task in self._retries.values():
                task.cancel()
            if self._on_release is not None:
                self._on_release(self)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _hook(self, name: str, *args: Any) -> None:
        await maybe_await(getattr(self.job, name)(*args))

    async def _dispatch_hook(
        self, *, incomplete: bool, resuming: bool, stage: int | None = None
    ) -> None:
        """`on_before_dispatching_job_steps` for `stage` (default: the first open one)."""
        if stage is None:
            stage = self._first_open_stage()
        await self._hook(
            "on_before_dispatching_job_steps",
            JobStepDispatchContext(
                initialization_may_be_incomplete=incomplete,
                resuming=resuming,
                stage=stage if stage is not None else 0,
            ),
        )

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
                JobStepState(
                    id=planned.step_id,
                    job_id=self.id,
                    type=planned.step_type,
                    name=planned.name,
                    stage=planned.stage,
                    status=JobStepStatus.UNKNOWN,
                    is_prepared=True,
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

    # -- stages and dispatch ----------------------------------------------------------------

    def _stages(self) -> list[int]:
        return sorted(self._stage_steps)

    def _stage_done(self, stage: int) -> bool:
        return all(step_id in self._counted for step_id in self._stage_steps.get(stage, ()))

    def _stage_has_failures(self, stage: int) -> bool:
        entry = counting.stage_entry(self.state.progress, stage)
        if entry is not None:
            return entry.failed_steps > 0
        return self.state.progress.failed_steps > 0

    def _crossed_barrier(self) -> int | None:
        """A completed stage with failures that stops the job, while later steps are open."""
        stages = self._stages()
        for index, stage in enumerate(stages):
            if not self._stage_done(stage):
                return None
            if self._stage_has_failures(stage) and (
                self.job.failure_behavior_for(stage) == JobStageFailureBehavior.STOP_JOB
            ):
                later = stages[index + 1 :]
                if any(not self._stage_done(s) for s in later):
                    return stage
                return None
        return None

    def _first_open_stage(self) -> int | None:
        for stage in self._stages():
            if not self._stage_done(stage):
                return stage
        return None

    async def _advance(self, *, dispatch_failures_fail: bool = True) -> int:
        """Move the job on: fill the window, open the next stage, cross barriers, complete.

        Returns how many steps failed to start on the way.
        """
        failed = 0
        while self.state.status == JobStatus.RUNNING and not self.released:
            if self._waiting and self._room():
                failed += await self._dispatch_waiting(dispatch_failures_fail)
                continue
            stage = self._current_stage
            if stage is not None and not self._stage_done(stage):
                return failed  # outcomes still to come
            barrier = self._crossed_barrier()
            if barrier is not None:
                await self._mark_unreachable_after(barrier)
            following = self._first_open_stage()
            if following is None:
                await self._complete()
                return failed
            if following != stage:
                if stage is not None:
                    try:
                        await self._dispatch_hook(incomplete=False, resuming=False, stage=following)
                    except Exception as error:
                        self.log.exception(
                            "job %s: dispatch hook failed before stage %s", self.id, following
                        )
                        self.counters.hook_errors.append(str(error))
                        return failed
                self._open_stage(following)
            else:
                return failed
        return failed

    def _open_stage(self, stage: int) -> None:
        self._current_stage = stage
        counting.mark_started(self.state.progress, stage)
        self._waiting.extend(
            (step_id, self._next_attempt.get(step_id, 1))
            for step_id in self._stage_steps.get(stage, ())
            if step_id not in self._counted and step_id not in self._tracked
        )

    def _room(self) -> int:
        window = self._window
        if window is None:
            return len(self._waiting)
        return max(0, window - len(self._tracked) - len(self._retries))

    async def _dispatch_waiting(self, failures_fail: bool) -> int:
        room = min(self._room(), DISPATCH_BATCH * self.ctx.options.max_concurrent_step_starts)
        chosen: list[StepStart] = []
        generation = self.state.execution_generation
        while self._waiting and len(chosen) < room:
            step_id, attempt = self._waiting.popleft()
            if step_id in self._counted or step_id in self._tracked:
                continue
            chosen.append(StepStart(step_id, generation, attempt))
        if not chosen:
            return 0
        for start in chosen:
            self._tracked[start.step_id] = _Tracked(
                self._stage_of.get(start.step_id, 0), start.attempt, generation
            )
        batches = [chosen[i : i + DISPATCH_BATCH] for i in range(0, len(chosen), DISPATCH_BATCH)]
        limit = asyncio.Semaphore(self.ctx.options.max_concurrent_step_starts)

        async def send(batch: list[StepStart]) -> list[StartResult] | BaseException:
            async with limit:
                try:
                    return await self.ctx.dispatcher.start_steps(
                        self.ctx.key, self.id, self.state.type, batch
                    )
                except Exception as error:
                    return error

        answers = await asyncio.gather(*(send(batch) for batch in batches))
        self.counters.dispatched += len(chosen)
        failed = 0
        for batch, answer in zip(batches, answers, strict=True):
            if isinstance(answer, BaseException):
                failed += await self._undelivered(batch, answer, failures_fail)
                continue
            for result in answer:
                failed += await self._started(result)
        return failed

    async def _started(self, result: StartResult) -> int:
        if result.outcome in (StartOutcome.STARTED, StartOutcome.ALREADY_STARTED):
            return 0
        if result.outcome == StartOutcome.COMPLETED and result.report is not None:
            await self._handle_report(result.report, from_start=True)
            return 0
        tracked = self._tracked.pop(result.step_id, None)
        stage = tracked.stage if tracked else self._stage_of.get(result.step_id, 0)
        self.log.warning(
            "job %s: step %s failed to start: %s", self.id, result.step_id, result.reason
        )
        await self._count(
            StepReport(
                step_id=result.step_id,
                status=JobStepStatus.FAILED,
                generation=self.state.execution_generation,
                attempt=tracked.attempt if tracked else 1,
                stage=stage,
                name=self._names.get(result.step_id, ""),
            )
        )
        return 1

    async def _undelivered(
        self, batch: list[StepStart], error: BaseException, failures_fail: bool
    ) -> int:
        """A start batch that reached no worker: count it failed on a clean start (or when no
        worker qualifies); retry it on the watchdog's interval otherwise."""
        if failures_fail or (isinstance(error, NoEligibleJobWorker) and failures_fail):
            failed = 0
            for start in batch:
                failed += await self._started(
                    StartResult(start.step_id, StartOutcome.FAILED, reason=str(error))
                )
            return failed
        for start in batch:
            self._tracked.pop(start.step_id, None)
        self.log.warning(
            "job %s: %d step start(s) were not delivered (%s); retrying every %s",
            self.id,
            len(batch),
            error,
            self.ctx.options.job_watchdog_interval,
        )
        self._spawn(self._redeliver(batch))
        return 0

    async def _redeliver(self, batch: list[StepStart]) -> None:
        await self.ctx.clock.sleep(self.ctx.options.job_watchdog_interval.total_seconds())
        async with self._turn:
            if self.released or self.state.status != JobStatus.RUNNING:
                return
            self._waiting.extendleft(
                (s.step_id, s.attempt) for s in reversed(batch) if s.step_id not in self._counted
            )
            await self._advance(dispatch_failures_fail=False)
            await self._persist_progress()

    async def _mark_unreachable_after(self, stage: int) -> None:
        later = [s for s in self._stages() if s > stage]
        ids = [i for s in later for i in self._stage_steps[s] if i not in self._counted]
        if not ids:
            return
        storage = self.ctx.storage.steps
        for offset in range(0, len(ids), PREPARE_BATCH):
            chunk = ids[offset : offset + PREPARE_BATCH]
            states = await storage.get_many(self.id, chunk)
            now = self.ctx.clock.now()
            for state in states:
                state.status = JobStepStatus.UNREACHABLE
                state.status_changes = [
                    *state.status_changes,
                    StatusChange(status=int(JobStepStatus.UNREACHABLE), occurred=now),
                ]
            await _save_all(storage, states)
        for step_id in ids:
            counting.count(self.state.progress, self._stage_of[step_id], JobStepStatus.UNREACHABLE)
            self._counted.add(step_id)
        for entry in self.state.progress.stages:
            if entry.stage in later:
                entry.is_started = False

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

    def _retry(self, report: StepReport) -> bool:
        """Schedule another attempt if one is allowed; True when the failure is not final."""
        if report.non_retryable or report.attempt >= self._max_attempts:
            return False
        outcome = self._outcome(report)
        try:
            if not self.job.should_retry_step(outcome, report.error or outcome.error):  # type: ignore[arg-type]
                return False
        except Exception:
            self.log.exception("job %s: should_retry_step failed; not retrying", self.id)
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
        if step.attempt >= self._max_attempts:
            return False
        if step.error is not None and step.error.non_retryable:
            return False
        outcome = StepOutcome(
            step_id=step.id,
            name=step.name,
            stage=step.stage,
            status=step.status,
            attempt=step.attempt,
            error=step.error,
        )
        try:
            return bool(self.job.should_retry_step(outcome, step.error))  # type: ignore[arg-type]
        except Exception:
            return False

    # -- watching ---------------------------------------------------------------------------

    async def snapshot(self) -> JobState:
        async with self._turn:
            return self.state.model_copy(deep=True)

    @property
    def busy(self) -> bool:
        """Outcomes queued or being counted (timers waiting on the clock do not count)."""
        return bool(self._inbox) or (self._drain_task is not None and not self._drain_task.done())


async def _save_all(storage: Any, states: list[JobStepState]) -> None:
    """Save step records the job changes (Unreachable), re-reading any that moved meanwhile."""
    try:
        versions = await storage.save_many(states)
    except VersionConflictError as conflict:
        lost = set(conflict.conflicts)
        rest = [s for s in states if s.id not in lost]
        if rest:
            await _save_all(storage, rest)
        return
    for state, version in zip(states, versions, strict=True):
        state.version = version


def _stage_sizes(plan: Iterable[PlannedStep]) -> dict[int, int]:
    sizes: dict[int, int] = {}
    for step in plan:
        sizes[step.stage] = sizes.get(step.stage, 0) + 1
    return sizes


__all__ = ["JobActivation", "JobStartResult", "Released"]
