"""StopAndDrain: a stop that answers only once every step that may run has stopped.

The job is persisted Stopped together with a pending drain, in one write. Each step that may
still run is asked to stop, persist its outcome and answer (`StepWorker.stop_and_wait`); a step
counts as drained only by its own answer. A step no worker runs is drained from step storage:
its settled outcome is counted as stored, and a record still Scheduled or Running is written
Stopped by the job (compare-and-set), so its outcome is in storage before the drain answers.

`Drained` is answered when every asked step answered, `on_stopped` has run and the job's state
is written; otherwise `TimedOut` with the steps that did not answer. The pending drain stays in
the job's record until every step has reported, so `Resume()` refuses the job until then and a
new activation (after the controller went away) completes the drain.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ..jobs.errors import DrainJobResult, DrainOutcome, StopJobError, StopJobFailed
from ..jobs.state import JobStepState, StatusChange, StepError
from ..jobs.status import RUNNING_JOB_STATUSES, JobStatus, JobStepStatus
from .activation import ActivationCore
from .messages import StepReport, StopRequest
from .outcomes import Outcomes
from .record import Released
from .stopping import Stopping


class Draining:
    """Drains a job: stop, wait for every step's own answer, finish the stop. The caller holds
    the job's turn for the whole drain, so reports that arrive meanwhile wait for it."""

    def __init__(self, core: ActivationCore, outcomes: Outcomes, stopping: Stopping) -> None:
        self.core = core
        self.record = core.record
        self.ledger = core.ledger
        self.outcomes = outcomes
        self.stopping = stopping

    async def drain(self, within: float | None = None) -> DrainOutcome:
        """Drain the job within `within` seconds (default: `step_stop_timeout`)."""
        core = self.core
        clock = core.ctx.clock
        seconds = within if within is not None else core.ctx.options.step_stop_timeout
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        deadline = clock.now() + timedelta(seconds=seconds)
        state = self.record.state
        if state.status.is_terminal:
            return DrainOutcome(DrainJobResult.COMPLETED)
        if state.status == JobStatus.STOPPED and state.stop_finalized and not state.pending_drain:
            # A finished stop: every step reported or never ran, and the hooks ran. Nothing
            # is left to wait for, and `on_stopped` is not run again for nothing.
            return DrainOutcome(DrainJobResult.DRAINED)
        await self._persist_pending_drain()
        asked = await self.stopping.candidates()
        asked |= self.stopping.take_notices()  # a live run of this execution answers too
        drained: set[str] = set()
        unanswered: set[str] = set()
        if asked:
            drained, unanswered = await self._ask(asked, deadline)
        if unanswered:
            # Told again until every worker has answered for them (one whose host did not
            # answer may still run); each reports once its work settles.
            self.stopping.tell_later(unanswered)
        try:
            await self.stopping.finish_if_settled()
            await self.record.save_progress()
        except Released:
            return DrainOutcome(DrainJobResult.TIMED_OUT, tuple(sorted(drained)), ())
        settled = not unanswered and self.record.state.stop_finalized
        return DrainOutcome(
            DrainJobResult.DRAINED if settled else DrainJobResult.TIMED_OUT,
            tuple(sorted(drained)),
            tuple(sorted(unanswered)),
        )

    async def _persist_pending_drain(self) -> None:
        """Stopped and a pending drain, in one write; a failed write leaves the job as it was."""
        record = self.record
        state = record.state
        status = state.status
        if status != JobStatus.STOPPED and status not in RUNNING_JOB_STATUSES:
            raise StopJobFailed(
                f"the job is {status.name}, it cannot be drained",
                code=StopJobError.JOB_IS_NOT_RUNNING,
            )
        previous = (status, state.status_changes, state.stop_finalized, state.pending_drain)
        if status != JobStatus.STOPPED:
            record.change(JobStatus.STOPPED)
        state.stop_finalized = False
        state.pending_drain = True
        try:
            await record.save()
        except Exception as error:
            (state.status, state.status_changes, state.stop_finalized, state.pending_drain) = (
                previous
            )
            record.release(f"could not persist the drain: {error}")
            raise StopJobFailed(
                f"the drain could not be written: {error}",
                code=StopJobError.COULD_NOT_PERSIST_STOP,
            ) from error

    async def _ask(self, asked: set[str], deadline: datetime) -> tuple[set[str], set[str]]:
        """Ask every step that may run to stop and answer; drain the rest from storage.
        Returns the drained steps and those that did not answer."""
        core = self.core
        ledger = self.ledger
        state = self.record.state
        ledger.stop(asked, state.execution_generation)  # tracked until accounted for
        drained: set[str] = set()
        unanswered: set[str] = set()
        idle: list[str] = []
        round_limit = core.ctx.options.step_stop_timeout.total_seconds()
        waiting = set(asked)
        first_round = True
        while waiting:
            # Rounds of at most `step_stop_timeout`: a worker answers each within it, below
            # the bound on calls between hosts; the steps that did not answer are asked again.
            remaining = (deadline - core.ctx.clock.now()).total_seconds()
            try:
                answer = await core.ctx.dispatcher.stop_and_wait(
                    StopRequest(
                        job_key=core.ctx.key,
                        job_id=core.id,
                        generation=state.execution_generation,
                        step_ids=tuple(sorted(waiting)),
                    ),
                    within=max(0.0, min(remaining, round_limit)),
                )
            except Exception as error:
                core.log.warning("job %s: asking the steps to drain failed: %s", core.id, error)
                # A live run of this execution not told yet (first round): notice it again. Once
                # told, its report is awaited like any other.
                notices = {s for s in waiting if ledger.is_counted(s)} if first_round else set()
                self.stopping.notice_later(notices)
                self.stopping.tell_later(waiting - notices)
                return drained, waiting
            first_round = False
            for report in answer.settled:
                if report.step_id in waiting:
                    drained.add(report.step_id)
                    await self._account(report)
            unanswered = set(answer.timed_out) & waiting
            idle.extend(sorted(waiting - drained - unanswered))
            waiting = unanswered
            if core.ctx.clock.now() >= deadline:
                break
        try:
            drained |= await self._drain_idle(idle)
        except Exception as error:
            core.log.warning("job %s: draining idle steps from storage failed: %s", core.id, error)
        unanswered |= asked - drained
        return drained, unanswered

    async def _account(self, report: StepReport) -> None:
        """Count a step's own answer once; a later report of it is then ignored."""
        if self.ledger.is_counted(report.step_id):
            self.ledger.forget(report.step_id)
            return
        if report.status in (JobStepStatus.STOPPED, JobStepStatus.REMOVING):
            await self.stopping.count_stop(report.step_id, report.status)
        else:
            await self.outcomes.count(report)

    async def _drain_idle(self, step_ids: list[str]) -> set[str]:
        """Steps no worker runs: their stored outcome counts; a record left Scheduled or
        Running is written Stopped (compare-and-set), so storage holds the stop."""
        if not step_ids:
            return set()
        core = self.core
        storage = core.ctx.storage.steps
        stored = await self.stopping.stored_outcomes(step_ids)
        drained: set[str] = set()
        for step_id in step_ids:
            report = stored.get(step_id)
            if report is not None:
                await self._account(report)
                drained.add(step_id)
        records = await storage.get_many(core.id, [s for s in step_ids if s not in drained])
        found = {record.id: record for record in records}
        for step_id in step_ids:
            if step_id in drained:
                continue
            record = found.get(step_id)
            if record is not None and record.status not in (
                JobStepStatus.STOPPED,
                JobStepStatus.REMOVING,
            ):
                try:
                    await storage.save(self._stopped(record))
                except Exception as error:
                    core.log.warning("job %s: step %s not drained: %s", core.id, step_id, error)
                    continue
            await self.stopping.count_stop(step_id, JobStepStatus.STOPPED)
            drained.add(step_id)
        return drained

    def _stopped(self, record: JobStepState) -> JobStepState:
        error = StepError(messages=["stopped"], cancelled=True)
        change = StatusChange(
            status=int(JobStepStatus.STOPPED),
            occurred=self.core.ctx.clock.now(),
            exception_messages=["stopped"],
        )
        return record.model_copy(
            update={
                "status": JobStepStatus.STOPPED,
                "error": error,
                "lease": None,
                "status_changes": [*record.status_changes, change],
            }
        )
