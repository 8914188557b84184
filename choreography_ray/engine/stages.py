"""Stages and dispatch: which steps run next, in batches, and the barriers between stages."""

from __future__ import annotations

import asyncio
from typing import Any

from ..jobs.errors import (
    NoEligibleJobWorker,
)
from ..jobs.job import JobStageFailureBehavior
from ..jobs.state import StatusChange
from ..jobs.status import (
    JobStatus,
    JobStepStatus,
)
from . import progress as counting
from .activation import (
    DISPATCH_BATCH,
    PREPARE_BATCH,
    _save_all,
    _Tracked,
)
from .messages import StartOutcome, StartResult, StepReport, StepStart


class Staging:
    """Moves a running job on: fills the window, opens stages, crosses barriers."""

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

        answers = await self._outside_turn(asyncio.gather(*(send(batch) for batch in batches)))
        self.counters.dispatched += len(chosen)
        if self.released:
            return 0
        failed = 0
        for batch, answer in zip(batches, answers, strict=True):
            if isinstance(answer, BaseException):
                failed += await self._undelivered(batch, answer, failures_fail)
                continue
            for result in answer:
                failed += await self._started(result)
        return failed

    async def _outside_turn(self, waiting: Any) -> Any:
        """Await workers' answers without holding the job's turn.

        A large dispatch is answered only as fast as busy workers take the calls; meanwhile
        the outcomes of steps already running are counted, instead of piling up until the
        last answer. What the answers then say is taken as it stands by then: a step may
        already be counted, or the job stopped.
        """
        self._turn.release()
        try:
            return await waiting
        finally:
            cancelled = False
            while True:  # the caller's `async with` releases the turn: it must be held again
                try:
                    await self._turn.acquire()
                    break
                except asyncio.CancelledError:
                    cancelled = True
            if cancelled:
                raise asyncio.CancelledError()

    async def _started(self, result: StartResult) -> int:
        if result.outcome in (StartOutcome.STARTED, StartOutcome.ALREADY_STARTED):
            return 0
        if result.outcome == StartOutcome.COMPLETED and result.report is not None:
            await self._handle_report(result.report, from_start=True)
            return 0
        tracked = self._tracked.pop(result.step_id, None)
        if self.state.status != JobStatus.RUNNING or result.step_id in self._counted:
            return 0  # stopped meanwhile: the step was not run, and a resume starts it again
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
