"""Stop and remove: persisted first, then every step that may run is told or counted.

A step that may still run keeps the stop open until its worker has been told: a failed
notification is retried (1 s, doubling to 60 s) for as long as the job stays stopped or being
removed, and `on_stopped` runs only once every step has reported. A step its worker no longer
runs is counted with the outcome step storage holds for it, so a success that raced the stop
counts as the success it is. A stop stored by an earlier execution counts as the step's stop,
and the run this execution may have started for it is told once that the job stops or is
removed.
"""

from __future__ import annotations

import asyncio

from ..jobs.errors import RemoveJobError, RemoveJobFailed, StopJobError, StopJobFailed
from ..jobs.retry import Backoff
from ..jobs.state import JobStepState
from ..jobs.status import RUNNING_JOB_STATUSES, JobStatus, JobStepStatus
from . import progress as counting
from .activation import ActivationCore
from .messages import StepReport, StopRequest
from .outcomes import Outcomes
from .recount import Recount
from .stored_steps import FINISHED, stored_outcome

NOTIFY_RETRY_DELAY = 1.0
"""Seconds before a failed stop notification is sent again; doubled after every failure."""
NOTIFY_RETRY_CAP = 60.0

_STOPPING = (JobStatus.STOPPED, JobStatus.REMOVING)
_SETTLED = FINISHED | {JobStepStatus.FAILED}


class Stopping:
    """Stopping and removing a job, and finishing a stop after a crash. The caller holds the
    job's turn."""

    def __init__(self, core: ActivationCore, outcomes: Outcomes, recount: Recount) -> None:
        self.core = core
        self.record = core.record
        self.ledger = core.ledger
        self.outcomes = outcomes
        self.recount = recount
        self._untold: set[str] = set()
        """Steps that may run and whose worker has not yet answered a stop notification."""
        self._notices: set[str] = set()
        """Steps counted stopped by a stop of an earlier execution, whose run of this execution
        may still be live: told once that the job stops or is removed (`candidates`)."""
        self._noticed: set[str] = set()
        """Steps told so by this activation: never told twice."""
        self._notify_backoff = Backoff(NOTIFY_RETRY_DELAY, NOTIFY_RETRY_CAP)
        self._notify_timer: asyncio.Task[None] | None = None
        self._finish_backoff = Backoff(NOTIFY_RETRY_DELAY, NOTIFY_RETRY_CAP)
        self._finish_timer: asyncio.Task[None] | None = None
        self._finish_error: Exception | None = None
        """Why the last finish of a removal failed; None once it succeeded."""

    async def stop(self) -> None:
        status = self.record.state.status
        if status.is_terminal:
            raise StopJobFailed("the job has completed", code=StopJobError.JOB_IS_COMPLETED)
        if status not in RUNNING_JOB_STATUSES:
            raise StopJobFailed(
                f"the job is {status.name}, not running", code=StopJobError.JOB_IS_NOT_RUNNING
            )
        await self._persist(JobStatus.STOPPED)
        await self._stop_steps(removing=False)

    async def remove(self) -> None:
        record = self.record
        status = record.state.status
        if status.is_terminal:
            raise RemoveJobFailed("the job has completed", code=RemoveJobError.JOB_IS_COMPLETED)
        if status == JobStatus.REMOVING:
            # Run the finish again once no step is left to report; say whether it failed. A
            # fresh activation first tells the steps again, as after a crash.
            if self.ledger.loaded:
                await self.finish_if_settled()
            else:
                await self._stop_steps(removing=True)
            if self._finish_error is not None:
                raise RemoveJobFailed(
                    f"finishing the removal failed again: {self._finish_error}",
                    code=RemoveJobError.UNKNOWN,
                )
            raise RemoveJobFailed(
                "the job is already being removed",
                code=RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED,
            )
        await self._persist(JobStatus.REMOVING)
        await self._stop_steps(removing=True)

    async def _persist(self, status: JobStatus) -> None:
        """Write `status` (Stopped or Removing) before any step hears of it. A write that
        fails leaves the job as it was: its status is restored and the activation lets go,
        so the next call reads storage again; the caller is answered COULD_NOT_PERSIST_STOP
        (a stop) or UNKNOWN (a removal, the seed's only code for it)."""
        record = self.record
        state = record.state
        previous = (state.status, state.status_changes, state.stop_finalized)
        record.change(status)
        state.stop_finalized = False
        try:
            await record.save()
        except Exception as error:
            state.status, state.status_changes, state.stop_finalized = previous
            record.info.status = previous[0]
            record.release(f"could not persist {status.name}: {error}")
            if status == JobStatus.REMOVING:
                raise RemoveJobFailed(
                    f"the removal could not be written: {error}", code=RemoveJobError.UNKNOWN
                ) from error
            raise StopJobFailed(
                f"the stop could not be written: {error}",
                code=StopJobError.COULD_NOT_PERSIST_STOP,
            ) from error

    async def finish_stop(self) -> None:
        """Finish a stop or removal that an earlier activation could not (after a crash)."""
        state = self.record.state
        if state.status not in (JobStatus.STOPPED, JobStatus.REMOVING):
            return
        if state.stop_finalized and state.status == JobStatus.STOPPED:
            return
        await self._stop_steps(removing=state.status == JobStatus.REMOVING)

    async def candidates(self) -> set[str]:
        """Steps that may still run and must be stopped, or counted as stopped."""
        ledger = self.ledger
        candidates = ledger.drain()
        if ledger.loaded and ledger.current is not None:
            return candidates
        # A fresh activation: recount from storage, as the stored progress may lag behind.
        stopped: list[tuple[str, int, int]] = []  # id, stage, generation: never the records

        def note(step: JobStepState) -> None:
            if step.status in (JobStepStatus.STOPPED, JobStepStatus.REMOVING):
                stopped.append((step.id, step.stage, step.generation))

        await self.recount.load(strict=False, each=note)
        state = self.record.state
        state.stopped_steps_counted = []
        earlier: set[str] = set()
        for step_id, stage, generation in stopped:
            ledger.count_stop(state, step_id)
            counting.count(state.progress, stage, JobStepStatus.STOPPED)
            ledger.settle(step_id)
            if generation < state.execution_generation:
                earlier.add(step_id)
        first_open = ledger.first_open_stage()
        if first_open is not None:
            counting.mark_started(state.progress, first_open)
            candidates.update(ledger.uncounted(first_open))
        # A stop stored by an earlier execution counts, once; but the run this execution
        # started for the step may still be live (queued, or waiting for that stop): it is told,
        # once, that the job stops or is removed, and its own stop is then already counted. A
        # notice that finds no run (the step was never started again) costs its id in one call.
        self._notices |= earlier
        return candidates

    def take_notices(self) -> set[str]:
        """The notices not sent yet, taken by a caller that tells the steps itself (a drain
        asks them to stop and answer)."""
        notices = self._notices - self._noticed
        self._noticed |= notices
        self._notices = set()
        return notices

    async def _stop_steps(self, *, removing: bool) -> None:
        """Tell workers to stop; count at once every step that is not running anywhere."""
        self._untold |= await self.candidates()
        self._notify_backoff.reset()
        await self._notify(removing=removing)
        await self.finish_if_settled()
        await self.record.save_progress()

    async def _notify(self, *, removing: bool) -> None:
        """Tell the workers to stop the steps not told yet. Until a worker answers, a step
        stays tracked, so the stop is not finalized while its work may still run; a failure
        schedules another try."""
        ledger = self.ledger
        state = self.record.state
        untold = {step_id for step_id in self._untold if not ledger.is_counted(step_id)}
        notices = self._notices - self._noticed
        if not untold and not notices:
            self._untold = set()
            self._notices = set()
            return
        ledger.stop(untold, state.execution_generation)  # kept until told
        core = self.core
        try:
            answer = await core.ctx.dispatcher.stop_steps(
                StopRequest(
                    job_key=core.ctx.key,
                    job_id=core.id,
                    generation=state.execution_generation,
                    step_ids=tuple(sorted(untold | notices)),
                    removing=removing,
                )
            )
            idle = sorted(untold - set(answer.stopping))
            stored = await self.stored_outcomes(idle)
        except Exception as error:
            core.log.warning(
                "job %s: telling workers to stop %d step(s) failed (%s); retrying in %.0f s",
                core.id,
                len(untold | notices),
                error,
                self._notify_backoff.peek(),
            )
            self._untold = untold
            self._notices = notices
            self._retry_notify_later()
            return
        self._untold = set()
        self._noticed |= notices
        self._notices = set()
        ledger.place(answer.hosts, state.execution_generation)
        await self._count_idle(idle, stored, removing=removing)

    async def lost(self, step_ids: list[str]) -> None:
        """Steps whose worker host is gone while the job stops: nothing runs them any more, so
        each counts with what step storage holds (a stop unless it settled), and the stop
        finishes once the others have reported."""
        idle = sorted(step_ids)
        await self._count_idle(
            idle,
            await self.stored_outcomes(idle),
            removing=self.record.state.status == JobStatus.REMOVING,
        )
        await self.finish_if_settled()

    async def _count_idle(
        self, idle: list[str], stored: dict[str, StepReport], *, removing: bool
    ) -> None:
        """Count steps that run nowhere: their stored outcome, else a stop (once per
        execution)."""
        ledger = self.ledger
        status = JobStepStatus.REMOVING if removing else JobStepStatus.STOPPED
        for step_id in idle:
            ledger.forget(step_id)
            if ledger.is_counted(step_id):
                continue
            report = stored.get(step_id)
            if report is None:
                await self.count_stop(step_id, status)
            else:
                await self.outcomes.count(report)

    async def count_stop(self, step_id: str, status: JobStepStatus) -> None:
        """Count a step's stop once per execution (`stopped_steps_counted`)."""
        ledger = self.ledger
        state = self.record.state
        ledger.forget(step_id)
        if ledger.is_counted(step_id):
            return
        if not ledger.count_stop(state, step_id):
            ledger.settle(step_id)
            return
        await self.outcomes.count(
            StepReport(
                step_id=step_id,
                status=status,
                generation=state.execution_generation,
                attempt=1,
                stage=ledger.stage_of(step_id),
                name=ledger.name_of(step_id),
            )
        )

    async def stored_outcomes(self, step_ids: list[str]) -> dict[str, StepReport]:
        """The settled outcomes step storage holds for steps no worker runs: what the job
        counts for them, so its counts equal step storage once the stop settles."""
        if not step_ids:
            return {}
        core = self.core
        states = await core.ctx.storage.steps.get_many(core.id, step_ids)
        found = (stored_outcome(step, _SETTLED) for step in states)
        return {report.step_id: report for report in found if report is not None}

    def tell_later(self, step_ids: set[str]) -> None:
        """Steps another operation could not tell to stop: keep them tracked and retry."""
        ledger = self.ledger
        ledger.stop(
            (step_id for step_id in step_ids if not ledger.is_counted(step_id)),
            self.record.state.execution_generation,
        )
        self._untold |= step_ids
        self._retry_notify_later()

    def notice_later(self, step_ids: set[str]) -> None:
        """Notices taken by a drain whose call failed: none reached a run, so they are sent
        again with the stop notifications (and the stop waits for them meanwhile)."""
        for step_id in step_ids:
            self.ledger.forget(step_id)
        self._noticed -= step_ids
        self._notices |= step_ids
        self._retry_notify_later()

    def _retry_notify_later(self) -> None:
        if self._notify_timer is not None and not self._notify_timer.done():
            return
        delay = self._notify_backoff.next()
        generation = self.record.state.execution_generation
        self._notify_timer = self.core.spawn(self._notify_later(delay, generation))

    async def _notify_later(self, delay: float, generation: int) -> None:
        """Retry the notification in the job's turn while the job stays stopped or being
        removed in the same execution; a resume or the end of the job ends the retries."""
        core = self.core
        await core.ctx.clock.sleep(delay)
        async with core.turn:
            self._notify_timer = None
            record = self.record
            state = record.state
            if (
                record.released
                or state.status not in _STOPPING
                or state.execution_generation != generation
            ):
                self._untold = set()
                self._notices = set()
                return
            try:
                await self._notify(removing=state.status == JobStatus.REMOVING)
                await self.finish_if_settled()
                await record.save_progress()
            except Exception:
                core.log.exception("job %s: finishing the stop failed", core.id)

    async def finish_if_settled(self) -> Exception | None:
        """Once no step runs any more: `on_stopped`, and a removal clears the job. Returns why
        finishing a removal failed here, else None.

        A removal whose finish fails (`on_stopped` raises, or clearing the job fails) is
        finished again by the next report (its sender is answered with the error, see
        `JobActivation.deliver_to_removal`) and on the job's own timer, 1 s doubling to 60 s,
        until the job is cleared."""
        record = self.record
        state = record.state
        if state.stop_finalized or not state.progress.is_stopped:
            return None
        if self.ledger.has_tracked or self._notices:
            return None  # a step may still run, or a live run has not been told yet
        if state.status != JobStatus.REMOVING:
            try:
                await self.core.hook("on_stopped")
            except Exception:
                self.core.log.exception("job %s: on_stopped failed", self.core.id)
            state.stop_finalized = True
            state.pending_drain = False  # every step has reported: a pending drain is complete
            if state.stored_step_plan_incarnation is not None:
                # A finalized stop is left alone from now on, as a terminal state is: its
                # stored plan would be orphaned (a resume reads the steps, not the plan).
                await record.delete_plan(state.stored_step_plan_incarnation)
            return None
        try:
            await self._finish_removal()
        except Exception as error:
            self.core.log.warning(
                "job %s: finishing the removal failed (%s); trying again in %.0f s",
                self.core.id,
                error,
                self._finish_backoff.peek(),
            )
            self._finish_error = error
            self._finish_later()
            return error
        self._finish_error = None
        self._finish_backoff.reset()
        return None

    async def _finish_removal(self) -> None:
        record = self.record
        await self.core.hook("on_stopped")
        if record.state.stored_step_plan_incarnation is not None:
            await record.delete_plan(record.state.stored_step_plan_incarnation)
        await record.clear()
        self.outcomes.finish()

    def _finish_later(self) -> None:
        if self._finish_timer is not None and not self._finish_timer.done():
            return
        self._finish_timer = self.core.spawn(self._finish_after(self._finish_backoff.next()))

    async def _finish_after(self, delay: float) -> None:
        """The job retries a failed removal finish itself: no report may come to trigger it."""
        core = self.core
        await core.ctx.clock.sleep(delay)
        async with core.turn:
            self._finish_timer = None
            if self.record.released or self.record.state.status != JobStatus.REMOVING:
                return
            await self.finish_if_settled()
