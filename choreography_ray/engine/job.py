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

`JobActivation` is the one door: it takes the turn and hands each call to the operation that
does it (see docs/decisions.md, "The activation by concept", for who calls whom).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import Any

from pydantic import BaseModel

from ..jobs.errors import DrainOutcome, RemoveJobError, RemoveJobFailed, ResumeJobSuccess
from ..jobs.job import Job, StepDetails
from ..jobs.state import JobOwner, JobState
from ..jobs.status import RUNNING_JOB_STATUSES, JobStatus
from . import adaptive, quarantine
from .activation import ActivationCore, JobStartResult
from .context import EngineContext
from .draining import Draining
from .messages import StepReport
from .outcomes import Outcomes
from .record import Counters, Released
from .recount import Recount
from .resuming import Resuming
from .stages import Stages
from .starting import DEFAULT_START, Starting, StartSettings
from .stopping import Stopping


class JobActivation:
    """The one live activation of one job: its public operations, each in the job's turn."""

    def __init__(
        self,
        ctx: EngineContext,
        job_class: type[Job[Any]],
        state: JobState,
        *,
        on_release: Callable[[JobActivation], None] | None = None,
        on_saved: Callable[[], None] | None = None,
    ) -> None:
        self._on_release = on_release
        core = self._core = ActivationCore(
            ctx, job_class, state, on_release=self._released, on_saved=on_saved
        )
        self._record = core.record
        self._outcomes = Outcomes(core)
        self._stages = Stages(core, self._outcomes)
        recount = Recount(core, self._outcomes)
        self._starting = Starting(core, self._stages, self._outcomes)
        self._stopping = Stopping(core, self._outcomes, recount)
        self._draining = Draining(core, self._outcomes, self._stopping)
        self._resuming = Resuming(core, self._starting, self._stages, self._outcomes, recount)
        self._inbox: list[StepReport] = []
        self._drain_task: asyncio.Task[None] | None = None
        if ctx.owner is not None:
            core.spawn(self._keep_lease())

    async def _keep_lease(self) -> None:
        """Renew this host's ownership lease while the job lives here: a job whose lease
        expired is claimed by the reconciliation sweep, so a lost activation never leaves a
        job idle."""
        core = self._core
        record = self._record
        every = core.ctx.options.job_ownership_lease.total_seconds() / 3
        while True:
            await core.ctx.clock.sleep(every)
            if record.released or record.state.status.is_terminal:
                return
            async with core.turn:
                if record.released:
                    return
                if record.state.status != JobStatus.NONE and record.lease_due():
                    try:
                        await record.save_progress()
                    except Released:
                        return

    def _released(self) -> None:
        if self._on_release is not None:
            self._on_release(self)

    # -- what the manager and tests read ------------------------------------------------------

    @property
    def id(self) -> str:
        return self._core.id

    @property
    def state(self) -> JobState:
        """The job's record as this activation holds it (read it in the job's turn)."""
        return self._record.state

    @property
    def job(self) -> Job[Any]:
        return self._core.job

    @property
    def job_class(self) -> type[Job[Any]]:
        return self._core.job_class

    @property
    def counters(self) -> Counters:
        return self._core.counters

    @property
    def released(self) -> bool:
        return self._record.released

    @property
    def release_reason(self) -> str:
        """Why the activation let go of the job; empty when it finished normally."""
        return self._record.release_reason

    @property
    def has_work(self) -> bool:
        """Steps are tracked, waiting or retrying here: the job runs in this activation."""
        return self._core.ledger.has_work

    @property
    def busy(self) -> bool:
        """Outcomes queued or being counted (timers waiting on the clock do not count)."""
        return bool(self._inbox) or (self._drain_task is not None and not self._drain_task.done())

    @property
    def outstanding(self) -> int:
        """Steps of a running job with no outcome yet: what it still asks of worker nodes."""
        state = self._record.state
        if self._record.released or state.status != JobStatus.RUNNING or state.waiting_for_key:
            return 0  # a job waiting for its concurrency key asks nothing of the nodes yet
        return self._core.ledger.outstanding

    def peek(self) -> JobState | None:
        """A copy of the job's record between two operations; None while one runs (it may
        be waiting on storage: a reader then reads storage instead of waiting behind it)."""
        if self._core.turn.locked():
            return None
        return self._record.state.model_copy(deep=True)

    async def workers_joined(self, joined: frozenset[str]) -> int:
        """Worker hosts joined the cluster: the job sends them work at once (see
        `Stages.workers_joined`)."""
        return await self._moves(self._stages.workers_joined, joined)

    async def hosts_draining(self, hosts: frozenset[str]) -> int:
        """Worker hosts whose node Ray drains: the job's runs queued there move to the others
        (see `Stages.hosts_draining`)."""
        return await self._moves(self._stages.hosts_draining, hosts)

    async def _moves(
        self, move: Callable[[frozenset[str]], Awaitable[int]], hosts: frozenset[str]
    ) -> int:
        async with self._core.turn:
            if self._record.released:
                return 0
            moved = await move(hosts)
            if moved:
                await self._record.save_progress()
            return moved

    def drop(self) -> None:
        """Let go without writing anything (the host shuts down): every background task ends."""
        self._record.released = True
        self._core.cancel_background()

    # -- operations -----------------------------------------------------------------------------

    async def start(
        self,
        request: BaseModel,
        steps: Iterable[StepDetails] | None = None,
        max_active_steps: int | None = None,
        settings: StartSettings = DEFAULT_START,
    ) -> JobStartResult:
        async with self._core.turn:
            return await self._starting.start(request, steps, max_active_steps, settings)

    async def stop(self) -> None:
        async with self._core.turn:
            await self._stopping.stop()

    async def remove(self) -> None:
        async with self._core.turn:
            await self._stopping.remove()

    async def drain(self, within: float | None = None) -> DrainOutcome:
        """Stop the job and wait, up to `within` seconds, for every step to answer."""
        async with self._core.turn:
            return await self._draining.drain(within)

    async def finish_stop(self) -> None:
        """Finish a stop, removal or drain that an earlier activation could not (after a
        crash): a pending drain is completed, waiting for its steps as a drain does."""
        async with self._core.turn:
            if self._record.state.pending_drain:
                await self._draining.drain()
            else:
                await self._stopping.finish_stop()
            await quarantine.completed(self._record)

    async def resume(self, *, recovering: bool = False) -> ResumeJobSuccess:
        """Resume the job (`recovering` marks a resume by recovery rather than by a caller).
        A caller's resume takes the job out of quarantine first; a resume that completes sets
        the count of recovery attempts back to 0."""
        async with self._core.turn:
            take_out = None if recovering else partial(quarantine.take_out, self._record)
            answer = await self._resuming.resume(before=take_out)
            await quarantine.completed(self._record)
            return answer

    async def retry_failed(self, step_ids: Sequence[str] | None = None) -> tuple[str, ...]:
        """Run the job's failed steps again (see `Resuming.rerun`); the ones run again."""
        async with self._core.turn:
            chosen = await self._resuming.rerun(step_ids)
            await quarantine.completed(self._record)
            return chosen

    async def set_priority(self, priority: int) -> None:
        """Store the job's new priority and tell its worker hosts (a job not running has no
        runs queued: its next dispatch carries it)."""
        async with self._core.turn:
            record = self._record
            record.state.priority = priority
            await record.save()
            points = self._core.points()
            if points is not None and record.state.status == JobStatus.RUNNING:
                await self._core.ctx.dispatcher.prioritize(self._core.ctx.key, self.id, points)

    async def hand_over(self, owner: JobOwner) -> bool:
        """Make `owner` (another controller host) the job's owner by compare-and-set, and let
        the job go without acting on it again: this host's node drains. False when the write
        lost (the job changed: whoever wrote it owns it) or the job is gone from here."""
        async with self._core.turn:
            record = self._record
            if record.released:
                return False
            lease = self._core.ctx.clock.now() + self._core.ctx.options.job_ownership_lease
            record.state.owner = owner.model_copy(update={"lease_expires": lease})
            try:
                await record.save()
            except Exception as error:
                record.release(f"it could not be handed over: {error}")
                return False
            record.log.warning(
                "job %s: handed over to %s: this host's node drains", self.id, owner.host
            )
            record.release()  # quietly: nothing here is to bring it back
            self._core.cancel_background()
            return True

    def let_go(self, reason: str) -> None:
        """Release the job without writing (a recovery that failed): the next call, report or
        sweep activates it again from storage."""
        self._record.release(reason)

    async def count_recovery(self) -> None:
        """Count a recovery about to begin, by compare-and-set; raises `JobQuarantinedError`
        (and lets the job go) when it would be one more than `max_recovery_attempts`."""
        async with self._core.turn:
            await quarantine.count_attempt(self._record)

    async def recovery_failed(self, error: BaseException) -> None:
        """Keep on the record why a counted recovery failed (the quarantine's reason)."""
        async with self._core.turn:
            await quarantine.failed(self._record, error)

    async def hosts_lost(self, hosts: frozenset[str]) -> int:
        """Worker hosts that are gone: the starts they took are sent again (a running job) or
        counted as stopped (a job being stopped: nothing runs there any more). Returns how
        many steps were affected."""
        async with self._core.turn:
            record = self._record
            if record.released:
                return 0
            lost = self._core.ledger.lose(hosts)
            if not lost:
                return 0
            status = record.state.status
            self._core.log.warning(
                "job %s: %d step(s) ran on lost host(s) %s; %s",
                self.id,
                len(lost),
                ", ".join(sorted(hosts)),
                "sending them again" if status == JobStatus.RUNNING else "counting them stopped",
            )
            try:
                if status == JobStatus.RUNNING:
                    self._stages.send_again(lost)
                    await self._stages.advance(dispatch_failures_fail=False)
                elif status in (JobStatus.STOPPED, JobStatus.REMOVING):
                    await self._stopping.lost([step_id for step_id, _ in lost])
                await record.save_progress()
            except Released:
                pass
            return len(lost)

    # -- reports --------------------------------------------------------------------------------

    def deliver(self, reports: Sequence[StepReport]) -> None:
        """Queue outcomes from workers; they are counted in the job's own turn."""
        self._inbox.extend(reports)
        if self._drain_task is None or self._drain_task.done():
            self._drain_task = self._core.spawn(self._drain())

    async def deliver_to_removal(self, reports: Sequence[StepReport]) -> None:
        """Reports to a job being removed, counted in the job's turn before the sender is
        answered: when finishing the removal fails, the sender gets the error
        (`RemoveJobFailed`, code `UNKNOWN`) and reports again, which runs the finish again
        (the seed's "a removal finishes even when a report fails"). A job already cleared
        answers that nothing is left to report.

        The sender waits for the turn at most half of `host_call_timeout`: a turn held longer
        (a worker that does not answer a stop, a slow `on_stopped`) must not make the sender
        take this host for gone. The reports are then queued like any others, and a failed
        finish is left to the job's own timer."""
        turn = self._core.turn
        if not await self._take_turn_within(
            self._core.ctx.options.host_call_timeout.total_seconds() / 2
        ):
            self.deliver(reports)
            return
        record = self._record
        try:
            if record.released and not record.release_reason:
                return  # cleared (or handed over): nothing left to report here
            failed = None if record.released else await self._handle(reports)
        finally:
            turn.release()
        if record.released and record.release_reason:
            # The stop was not stored (a write failed): the step keeps its record and
            # reports again, to the job's next activation.
            raise RemoveJobFailed(
                f"job {self.id}: its activation let go ({record.release_reason}); report again",
                code=RemoveJobError.UNKNOWN,
            )
        if failed is not None:
            raise RemoveJobFailed(
                f"job {self.id}: finishing the removal failed ({failed}); report again",
                code=RemoveJobError.UNKNOWN,
            )

    async def _take_turn_within(self, seconds: float) -> bool:
        """Acquire the job's turn, waiting at most `seconds` on the job's clock; whether it
        was acquired (the caller then releases it)."""
        turn = self._core.turn
        acquiring = asyncio.ensure_future(turn.acquire())
        deadline = asyncio.ensure_future(self._core.ctx.clock.sleep(seconds))
        try:
            await asyncio.wait((acquiring, deadline), return_when=asyncio.FIRST_COMPLETED)
        finally:
            deadline.cancel()
        if not acquiring.done():
            acquiring.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await acquiring  # granted before the cancel landed: held, and used
        return acquiring.done() and not acquiring.cancelled()

    async def _drain(self) -> None:
        record = self._record
        while self._inbox and not record.released:
            async with self._core.turn:
                batch, self._inbox = self._inbox, []
                if record.released:
                    return
                await self._handle(batch)

    async def _handle(self, batch: Sequence[StepReport]) -> Exception | None:
        """Count a batch of reports and move the job on; the caller holds the turn. Returns
        why finishing a removal failed in this turn, else None."""
        record = self._record
        if not self._core.ledger.loaded and record.state.status in RUNNING_JOB_STATUSES:
            # Its steps were never read back (a recovery that has not run, or failed): it
            # cannot tell a step's first outcome from a repeat, nor the last from another.
            # The outcomes are in storage; the recovery that loads the steps counts them.
            record.counters.ignored_reports += len(batch)
            return None
        handle = self._outcomes.handle
        stages = self._stages
        failed = None
        if stages.adaptive is not None:  # only a job with steps that adapt their windows
            adaptive.observe(self._core, stages.adaptive, batch)
        try:
            for report in batch:
                retry = await handle(report)
                if retry is not None:
                    stages.retry(report.step_id, report.attempt + 1, retry.at)
            status = record.state.status
            if status == JobStatus.RUNNING:
                self._core.tell_progress()
                await stages.advance(dispatch_failures_fail=False)
            elif status in (JobStatus.STOPPED, JobStatus.REMOVING):
                failed = await self._stopping.finish_if_settled()
            await record.save_progress()
        except Released:
            pass
        except Exception as error:
            self._core.log.exception("job %s: handling step outcomes failed", self.id)
            record.release("handling step outcomes failed")
            return error
        return failed


__all__ = ["JobActivation", "JobStartResult", "Released"]
