"""Stages and dispatch: which steps run next, in batches, the barriers between stages, and the
timers that send a step again (a retry's backoff, an undelivered start)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from ..jobs.errors import NoEligibleJobWorker
from ..jobs.job import JobStageFailureBehavior
from ..jobs.state import StatusChange, StepError, WorkerWait
from ..jobs.status import JobStatus, JobStepStatus
from . import adaptive
from . import progress as counting
from .activation import DISPATCH_BATCH, PREPARE_BATCH, ActivationCore
from .adaptive import ClassWindows
from .dispatch_batches import send_in_batches
from .key_gate import KeyGate
from .messages import StartOutcome, StartResult, StepReport, StepStart, arrived
from .outcomes import Outcomes
from .ports import Dispatched
from .record import Released, save_all
from .watchdog import Watchdog


class Stages:
    """Moves a running job on: fills the window, opens stages, crosses barriers, completes."""

    def __init__(self, core: ActivationCore, outcomes: Outcomes) -> None:
        self.core = core
        self.record = core.record
        self.ledger = core.ledger
        self.outcomes = outcomes
        self.watchdog = Watchdog(core, self, outcomes)
        self.key = KeyGate(core, self._move_on)
        """Admission under the job's concurrency key, before anything is dispatched."""
        self.adaptive: ClassWindows | None = None
        """The job's adaptive windows, when a class of its steps adapts one."""
        self._adaptive_checked = False
        self._sent = 0
        """Steps the last dispatch started: none while every waiting one's class is full."""
        self.undelivered: set[str] = set()
        """Steps whose start no worker took, to be sent again: while there are any, a job
        that waits for a worker goes on waiting, whatever other steps a worker took."""
        self._joined = asyncio.Event()
        """Set (and replaced) when worker hosts join: undelivered starts go at once."""

    # -- worker hosts that join -------------------------------------------------------------------

    async def workers_joined(self, joined: frozenset[str]) -> int:
        """Worker hosts joined: starts no worker took go now, not at the next timer, and a
        share of the runs queued on the job's other hosts moves to them (runs that perform
        stay where they are). Returns how many runs moved. Call in the job's turn."""
        joined_event, self._joined = self._joined, asyncio.Event()
        joined_event.set()
        used = self.ledger.hosts_in_use() - joined
        if not used:
            return 0
        share = len(joined) / (len(used) + len(joined))
        return await self._move(dict.fromkeys(used, share), sorted(joined), "joined hosts")

    async def hosts_draining(self, draining: frozenset[str]) -> int:
        """Worker hosts whose node Ray drains: every run of the job queued there, not started,
        moves to the hosts that stay, ahead of the job's other waiting steps (runs that
        perform finish there, or are stopped and moved before the node goes). Returns how
        many runs moved. Call in the job's turn."""
        used = self.ledger.hosts_in_use() & draining
        if not used:
            return 0
        moved = await self._move(dict.fromkeys(used, 1.0), [], "draining hosts")
        return moved

    async def _move(self, shares: dict[str, float], to: list[str], what: str) -> int:
        """Take back `shares` of the job's queued runs from those hosts and send them again
        (to the hosts `to`, or wherever dispatch places them), under their identities."""
        ledger = self.ledger
        core = self.core
        if self.record.state.status != JobStatus.RUNNING:
            return 0
        try:
            given = await self._outside_turn(
                core.ctx.dispatcher.give_up(core.ctx.key, core.id, shares)
            )
        except Exception as error:  # nothing moved: the runs stay where they are
            core.log.warning("job %s: could not move queued runs: %s", core.id, error)
            return 0
        if self.record.released or self.record.state.status != JobStatus.RUNNING:
            return 0  # stopped meanwhile: the stop found no run of those steps, and counted it
        moved = ledger.move(given, to)
        if moved:
            core.log.info("job %s: %d queued run(s) move off %s", core.id, moved, what)
            await self.advance(dispatch_failures_fail=False)
        return moved

    # -- moving on ------------------------------------------------------------------------------

    async def advance(self, *, dispatch_failures_fail: bool = True) -> int:
        """Move the job on: fill the window, open the next stage, cross barriers, complete.

        `dispatch_failures_fail` says which moment this is (see `_undelivered`). Returns how
        many steps failed to start on the way.
        """
        record = self.record
        ledger = self.ledger
        failed = 0
        if not self.watchdog.started:
            self.watchdog.start()
        if not await self.key.admit():
            return failed  # it waits for its key; the gate moves it on once admitted
        while record.state.status == JobStatus.RUNNING and not record.released:
            if not await record.still_owned():
                return failed  # another host claimed the job: this activation let it go
            if ledger.queued and self._room():
                failed += await self._dispatch_waiting(dispatch_failures_fail)
                if self._sent:
                    continue
            stage = ledger.current
            if stage is not None and not ledger.stage_done(stage):
                return failed  # outcomes still to come
            barrier = self._crossed_barrier()
            if barrier is not None:
                await self._mark_unreachable_after(barrier)
            following = ledger.first_open_stage()
            if following is None:
                await self.outcomes.complete()
                return failed
            if following == stage:
                return failed
            if stage is not None:
                try:
                    await self.core.dispatch_hook(incomplete=False, resuming=False, stage=following)
                except Exception as error:
                    self.core.log.exception(
                        "job %s: dispatch hook failed before stage %s", self.core.id, following
                    )
                    self.core.counters.hook_errors.append(str(error))
                    return failed
            self.open_stage(following)
        return failed

    async def _move_on(self) -> None:
        await self.advance(dispatch_failures_fail=False)
        await self.record.save_progress()

    def open_stage(self, stage: int) -> None:
        self.ledger.open(stage)
        counting.mark_started(self.record.state.progress, stage)

    def _stage_has_failures(self, stage: int) -> bool:
        entry = counting.stage_entry(self.record.state.progress, stage)
        if entry is not None:
            return entry.failed_steps > 0
        return self.record.state.progress.failed_steps > 0

    def _crossed_barrier(self) -> int | None:
        """A completed stage with failures that stops the job, while later steps are open."""
        ledger = self.ledger
        stages = ledger.stages()
        for index, stage in enumerate(stages):
            if not ledger.stage_done(stage):
                return None
            if self._stage_has_failures(stage) and (
                self.core.job.failure_behavior_for(stage) == JobStageFailureBehavior.STOP_JOB
            ):
                later = stages[index + 1 :]
                if any(not ledger.stage_done(s) for s in later):
                    return stage
                return None
        return None

    async def _mark_unreachable_after(self, stage: int) -> None:
        ids = self.ledger.uncounted_after(stage)
        if not ids:
            return
        storage = self.core.ctx.storage.steps
        for offset in range(0, len(ids), PREPARE_BATCH):
            chunk = ids[offset : offset + PREPARE_BATCH]
            states = await storage.get_many(self.core.id, chunk)
            now = self.core.ctx.clock.now()
            for state in states:
                state.status = JobStepStatus.UNREACHABLE
                state.status_changes = [
                    *state.status_changes,
                    StatusChange(status=int(JobStepStatus.UNREACHABLE), occurred=now),
                ]
            await save_all(storage, states)
        progress = self.record.state.progress
        for step_id in ids:
            counting.count(progress, self.ledger.stage_of(step_id), JobStepStatus.UNREACHABLE)
            self.ledger.settle(step_id)
        for entry in progress.stages:
            if entry.stage > stage:
                entry.is_started = False

    # -- dispatch -------------------------------------------------------------------------------

    async def _dispatch_waiting(self, failures_fail: bool) -> int:
        core = self.core
        ledger = self.ledger
        room = min(self._room(), DISPATCH_BATCH * core.ctx.options.max_concurrent_step_starts)
        generation = self.record.state.execution_generation
        gate = self.adaptive.admits if self.adaptive and self.adaptive.gated else None
        now = core.ctx.clock.now()
        limit = asyncio.Semaphore(core.ctx.options.max_concurrent_step_starts)
        job_type = self.record.state.type
        losses = ledger.losses
        points = core.points()

        async def send(batch: list[StepStart], hosts: dict[str, str]) -> Dispatched | BaseException:
            async with limit:
                try:
                    if points is None:  # no priority: the call every dispatcher takes
                        return await core.ctx.dispatcher.start_steps(
                            core.ctx.key, core.id, job_type, batch, hosts, ledger.types
                        )
                    return await core.ctx.dispatcher.start_steps(
                        core.ctx.key, core.id, job_type, batch, hosts, ledger.types, points=points
                    )
                except Exception as error:
                    return error

        batches, sends = await send_in_batches(
            lambda size: ledger.start(size, generation, now, gate), room, DISPATCH_BATCH, send
        )
        self._sent = sent = sum(map(len, batches))
        if not sent:
            return 0
        answers = await self._outside_turn(asyncio.gather(*sends))
        core.counters.dispatched += sent
        if self.record.released:
            return 0
        failed = 0
        for batch, answer in zip(batches, answers, strict=True):
            if isinstance(answer, BaseException):
                failed += await self._undelivered(batch, answer, failures_fail)
                continue
            if answer.hosts:
                if self.undelivered:
                    for step_ids in answer.hosts.values():
                        self.undelivered.difference_update(step_ids)
                if not self.undelivered and not isinstance(answer.error, NoEligibleJobWorker):
                    # Workers took the starts. While some find none (steps of several types),
                    # the wait goes on, its deadline unchanged.
                    self.record.state.waiting_for_worker = None
            ledger.place(answer.hosts, generation)
            for result in answer.results:
                failed += await self._started(result)
            if answer.undelivered:
                error = answer.error or ConnectionError("no worker host took the starts")
                failed += await self._undelivered(answer.undelivered, error, failures_fail)
        if ledger.losses > losses:
            # A host was lost while the answers were on their way: what it took goes again.
            self.send_again(ledger.lose_again(losses))
        return failed

    def _room(self) -> int:
        """How many more steps may start: the job's window, or with classes of their own
        windows (`adaptive.ClassWindows`) what their rooms add up to."""
        ledger = self.ledger
        if not self._adaptive_checked:
            self._adaptive_checked = True  # once per activation: its steps' classes decide
            self.adaptive = adaptive.adaptive_windows(self.core)
            if self.adaptive is not None:
                adaptive.apply(self.core, self.adaptive)
        if self.adaptive is None or not self.adaptive.gated:
            return ledger.room(self.core.window)
        room = self.adaptive.room(ledger.types, ledger.active())
        return ledger.queued if room is None else room

    async def locate(self) -> None:
        """Learn where the job's runs are before sending anything (a new activation: the one
        that dispatched them is gone): each goes back to the host that holds it, where it
        answers that it has started, or waits for its older run's stop."""
        core = self.core
        try:
            held = await core.ctx.dispatcher.locate(core.ctx.key, core.id)
        except Exception as error:
            core.log.warning("job %s: could not ask where its runs are: %s", core.id, error)
            return
        self.ledger.pin(held)

    def send_again(self, steps: list[tuple[str, int]]) -> None:
        """Queue interrupted starts (a lost host's) first, under their attempt; the caller
        advances the job."""
        self.ledger.queue(steps, urgent=True)

    async def _outside_turn(self, waiting: Any) -> Any:
        """Await workers' answers without holding the job's turn.

        A large dispatch is answered only as fast as busy workers take the calls; meanwhile
        the outcomes of steps already running are counted, instead of piling up until the
        last answer. What the answers then say is taken as it stands by then: a step may
        already be counted, or the job stopped.
        """
        turn = self.core.turn
        turn.release()
        try:
            return await waiting
        finally:
            cancelled = False
            while True:  # the caller's `async with` releases the turn: it must be held again
                try:
                    await turn.acquire()
                    break
                except asyncio.CancelledError:
                    cancelled = True
            if cancelled:
                raise asyncio.CancelledError()

    async def _started(self, result: StartResult) -> int:
        if result.outcome in (StartOutcome.STARTED, StartOutcome.ALREADY_STARTED):
            return 0
        if result.outcome == StartOutcome.RUNNING_ELSEWHERE:
            self.ledger.runs_on(result.step_id, result.reason)  # its live run reports there
            return 0
        if result.outcome == StartOutcome.COMPLETED and result.report is not None:
            report = arrived(result.report)
            retry = await self.outcomes.handle(report)
            if retry is not None:
                self.retry(result.step_id, report.attempt + 1, retry.at)
            return 0
        ledger = self.ledger
        tracked = ledger.forget(result.step_id)
        state = self.record.state
        if state.status != JobStatus.RUNNING or ledger.is_counted(result.step_id):
            return 0  # stopped meanwhile: the step was not run, and a resume starts it again
        stage = tracked.stage if tracked else ledger.stage_of(result.step_id)
        self.core.log.warning(
            "job %s: step %s failed to start: %s", self.core.id, result.step_id, result.reason
        )
        await self.outcomes.count(
            StepReport(
                step_id=result.step_id,
                status=JobStepStatus.FAILED,
                generation=state.execution_generation,
                attempt=tracked.attempt if tracked else 1,
                stage=stage,
                name=ledger.name_of(result.step_id),
                error=StepError(messages=[result.reason or "the step did not start"]),
            )
        )
        return 1

    async def _undelivered(
        self, batch: list[StepStart], error: BaseException, failures_fail: bool
    ) -> int:
        """A start batch that reached no worker. The moment decides, not the error (the
        placement spec's three moments): while a job starts, its steps count as failed, and
        the start says so; on resume, recovery or a later stage the job stays Running and the
        batch is sent again every `job_watchdog_interval` until a worker takes it. A
        `NoEligibleJobWorker` is no different from a lost connection: no worker took it, except
        while a starting job may still wait for a worker (`worker_wait_timeout`): it waits
        as on resume, durably and visibly (`JobState.waiting_for_worker`)."""
        if failures_fail and (
            isinstance(error, NoEligibleJobWorker) or self.record.state.waiting_for_worker
        ):
            # A job that already waits for a worker goes on waiting when the one that came
            # is lost before it took the starts (a node the autoscaler gave up on).
            failures_fail = not self._wait_for_worker(error)
        if failures_fail:
            failed = 0
            for start in batch:
                self.undelivered.discard(start.step_id)
                failed += await self._started(
                    StartResult(start.step_id, StartOutcome.FAILED, reason=str(error))
                )
            return failed
        for start in batch:
            self.ledger.forget(start.step_id)
            self.undelivered.add(start.step_id)
        interval = self.core.ctx.options.job_watchdog_interval
        self.core.log.warning(
            "job %s: %d step start(s) were not delivered (%s); retrying every %s",
            self.core.id,
            len(batch),
            error,
            interval,
        )
        self.core.spawn(self._send_again(batch, interval.total_seconds()))
        return 0

    def _wait_for_worker(self, error: BaseException) -> bool:
        """Whether a starting job waits for a worker rather than failing its steps: it does
        until `worker_wait_timeout` has passed since it began to wait (recorded in the job's
        state, so that the wait outlives this activation)."""
        timeout = self.core.ctx.options.worker_wait_timeout
        state = self.record.state
        now = self.core.ctx.clock.now()
        since = state.waiting_for_worker.since if state.waiting_for_worker else now
        if not timeout or now - since >= timeout:
            state.waiting_for_worker = None
            return False
        state.waiting_for_worker = WorkerWait(reason=str(error), since=since)
        return True

    async def _send_again(self, batch: list[StepStart], delay: float) -> None:
        timer = asyncio.ensure_future(self.core.ctx.clock.sleep(delay))
        joined = asyncio.ensure_future(self._joined.wait())
        try:
            await asyncio.wait((timer, joined), return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            joined.cancel()
        async with self.core.turn:
            if self.record.released or self.record.state.status != JobStatus.RUNNING:
                return
            ledger = self.ledger
            self.undelivered.difference_update(
                s.step_id for s in batch if ledger.is_counted(s.step_id)
            )
            ledger.queue((s.step_id, s.attempt) for s in batch)
            # A job waiting for a worker since its start fails its steps once the wait ends.
            await self.advance(
                dispatch_failures_fail=self.record.state.waiting_for_worker is not None
            )
            await self.record.save_progress()

    # -- retries --------------------------------------------------------------------------------

    def retry(self, step_id: str, attempt: int, at: datetime | None) -> None:
        """Send the step's next attempt `attempt` once its retry time `at` has come (at once
        when it has passed): live, `at` is the decision's; on resume, the stored one."""
        now = self.core.ctx.clock.now()
        delay = 0.0 if at is None else max(0.0, (at - now).total_seconds())
        self.ledger.retry(step_id, self.core.spawn(self._retry_later(step_id, attempt, delay)))

    def retry_due(self) -> None:
        """Schedule the retries a recount found decided (`StepLedger.reconcile`)."""
        for step_id, (attempt, at) in self.ledger.take_due().items():
            self.retry(step_id, attempt, at)

    async def _retry_later(self, step_id: str, attempt: int, delay: float) -> None:
        try:
            await self.core.ctx.clock.sleep(delay)
        except asyncio.CancelledError:
            return
        async with self.core.turn:
            self.ledger.retry_due(step_id)
            if self.record.released or self.record.state.status != JobStatus.RUNNING:
                return
            try:
                await self.record.store_decisions()  # this retry's among them, before it goes
                self.ledger.queue([(step_id, attempt)])
                await self.advance(dispatch_failures_fail=False)
                await self.record.save_progress()
            except Released:
                return
