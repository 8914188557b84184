"""The job's record as its activation holds it, and every write of it.

Storage is the truth: the record is saved by compare-and-set, and a lost race means another
activation owns the job. Then this copy is let go (released) and nothing more is written from
it; the manager activates the job again from storage.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..jobs.errors import VersionConflictError
from ..jobs.history import noted
from ..jobs.job import Job, JobInfo
from ..jobs.state import JobOwner, JobState, JobStepState, StatusChange, StepDecision
from ..jobs.status import JobStatus, JobStepStatus
from .context import EngineContext, error_messages

log = logging.getLogger("choreography_ray.engine")


class Released(Exception):
    """The activation can no longer trust its copy of the job and has let it go."""


@dataclass
class Counters:
    """What one activation did, for tests and benchmarks."""

    reports: int = 0
    ignored_reports: int = 0
    dispatched: int = 0
    job_writes: int = 0
    step_batches: int = 0
    step_rows: int = 0
    hook_errors: list[str] = field(default_factory=list)


class JobRecord:
    """One job's state, its status changes and its writes; released once it cannot be trusted."""

    def __init__(
        self,
        ctx: EngineContext,
        job_class: type[Job[Any]],
        state: JobState,
        info: JobInfo,
        *,
        on_release: Callable[[], None],
        on_saved: Callable[[], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.job_class = job_class
        self.state = state
        self.info = info
        self.counters = Counters()
        self.log = logging.LoggerAdapter(log, {"job_id": state.id, "step_id": "-"})
        self.released = False
        self.release_reason = ""
        """Why the activation let go of the job; empty when it finished normally."""
        self._on_release = on_release
        self._on_saved = on_saved
        self._decisions: dict[str, StepDecision] = {}
        """Decisions on failed attempts not yet stored with them (see `decided`)."""
        self._saved_marks = _marks(state)
        """Status and progress as last saved: a write that changes them stamps `changed`."""

    @property
    def id(self) -> str:
        return self.state.id

    def change(self, status: JobStatus, error: BaseException | str | None = None) -> None:
        """Enter `status`, with the error that caused it in the status history."""
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
                host=self.ctx.owner.host if self.ctx.owner is not None else "",
            ),
        ]
        self.info.status = status
        self.info.progress = self.state.progress
        if self.ctx.on_status is not None:
            self.ctx.on_status(status)

    def decided(self, step_id: str, decision: StepDecision) -> None:
        """A decision on the step's stored failed attempt, to store with it before the next
        write of the job record, or before the retry it schedules is sent if that comes first
        (`store_decisions`); a final failure counts in the progress that write saves."""
        self._decisions[step_id] = decision

    async def _store_decisions(self) -> None:
        """Store the pending decisions on their step records, in one read and one write. A
        record that moved on meanwhile (a newer attempt, a removal) keeps what it holds."""
        if not self._decisions:
            return
        decisions, self._decisions = self._decisions, {}
        steps = self.ctx.storage.steps
        try:
            records = await steps.get_many(self.id, list(decisions))
            changed = [
                record.model_copy(update={"decision": decisions[record.id]})
                for record in records
                if record.status == JobStepStatus.COMPLETED_WITH_FAILURE
                and record.attempt == decisions[record.id].attempt
                and record.decision != decisions[record.id]
            ]
            if changed:
                await save_all(steps, changed)
        except BaseException:
            self._decisions = {**decisions, **self._decisions}
            raise

    async def store_decisions(self) -> None:
        """Store the pending decisions now, ahead of the job record's next write: a retry is
        sent only once its decision is stored. A turn that heard a failure goes on to dispatch
        other steps outside the job's turn; a retry sent meanwhile would be read by its worker
        before that turn stores the decision, and the decision's write would then land under
        the retry's run (its Running write finds the record changed, and the run stops). A
        failed write lets the job go (raises `Released`), as `save_progress` does."""
        if self.released or not self._decisions:
            return
        await self._or_let_go(self._store_decisions, "store step decisions")

    async def save(self) -> None:
        """Compare-and-set the job record; a lost race means another activation owns the job.
        Decisions on failed attempts are stored first (`decided`).

        A write of a job this host owns renews its ownership lease (`job_ownership_lease`)."""
        await self._store_decisions()
        state = self.state
        since = int((self.ctx.clock.now() - state.created).total_seconds())
        state.progress_history = noted(state.progress_history, since, state.progress.done_steps)
        marks = _marks(state)
        if marks != self._saved_marks:
            state.changed = self.ctx.clock.now()
        me = self.ctx.owner
        owner = self.state.owner
        if (
            me is not None
            and owner is not None
            and (owner.host, owner.activation_epoch) == (me.host, me.activation_epoch)
        ):
            self.state.owner = JobOwner(
                host=me.host,
                activation_epoch=me.activation_epoch,
                lease_expires=self.ctx.clock.now() + self.ctx.options.job_ownership_lease,
            )
        try:
            self.state.version = await self.ctx.storage.jobs.save(self.state)
        except VersionConflictError:
            self.release("the job changed in storage under this activation")
            raise
        self.counters.job_writes += 1
        self._saved_marks = marks
        if self._on_saved is not None:
            self._on_saved()

    async def save_progress(self) -> None:
        """Save what was counted; a failed write lets the job go (raises `Released`)."""
        if self.released or self.state.status == JobStatus.NONE:
            return
        if self.state.status.is_terminal and not self.keeps_state():
            return
        await self._or_let_go(self.save, "save progress")

    async def _or_let_go(self, write: Callable[[], Awaitable[None]], what: str) -> None:
        """`write`; if it fails, the job is let go (raises `Released`)."""
        try:
            await write()
        except Exception as error:
            self.release(f"could not {what}: {error}")
            raise Released() from error

    def lease_due(self) -> bool:
        """Whether the ownership lease should be renewed now: a third of it is gone."""
        me = self.ctx.owner
        owner = self.state.owner
        if me is None or owner is None or owner.lease_expires is None:
            return False
        lease = self.ctx.options.job_ownership_lease
        return owner.lease_expires - self.ctx.clock.now() <= lease * 2 / 3

    async def still_owned(self) -> bool:
        """Whether this activation may act on the job: its host's ownership lease holds, or,
        once it ran out unrenewed (writes that failed, a host that was frozen), a write proves
        by compare-and-set that no other host claimed the job meanwhile (and renews the
        lease). When that write loses, the job is let go: another host owns it."""
        me = self.ctx.owner
        owner = self.state.owner
        if me is None or owner is None or owner.lease_expires is None:
            return True
        if owner.lease_expires > self.ctx.clock.now():
            return True
        try:
            await self.save()
        except Exception as error:
            self.release(f"its ownership lease ran out and could not be renewed: {error}")
            return False
        return True

    def release(self, reason: str = "") -> None:
        """Let go of the job: for `reason` (logged), or quietly once it finished."""
        if self.released:
            return
        if reason:
            self.log.warning("job %s: activation released: %s", self.id, reason)
        self.released = True
        self.release_reason = reason
        self._on_release()

    def keeps_state(self) -> bool:
        """Whether the record stays in storage in its current status."""
        status = self.state.status
        if status == JobStatus.COMPLETED_WITH_FAILURES:
            return self.job_class.keep_after_completed_with_failures
        if status == JobStatus.COMPLETED_SUCCESSFULLY:
            return self.job_class.keep_after_completed
        return True

    async def delete_plan(self, incarnation: int) -> None:
        plans = self.ctx.storage.plans
        if plans is None:
            return
        try:
            await plans.delete_plan(self.id, incarnation)
        except Exception:
            self.log.exception("job %s: could not delete plan incarnation %s", self.id, incarnation)

    async def clear(self) -> None:
        """Delete the steps, then the job: what remains after a crash is still a whole job."""
        try:
            await self.ctx.storage.steps.remove_all_for_job(self.id)
            await self.ctx.storage.jobs.remove(self.id)
        except Exception:
            self.log.exception("job %s: could not clear its state", self.id)
            raise


async def save_all(storage: Any, states: list[JobStepState]) -> None:
    """Save step records the job changes (Unreachable, a decision); one that moved meanwhile
    (another run, a removal) keeps what it holds."""
    try:
        versions = await storage.save_many(states)
    except VersionConflictError as conflict:
        lost = set(conflict.conflicts)
        rest = [s for s in states if s.id not in lost]
        if rest:
            await save_all(storage, rest)
        return
    for state, version in zip(states, versions, strict=True):
        state.version = version


def _marks(state: JobState) -> tuple[object, ...]:
    """What a reader calls a change of the job: its status and its progress (a write that
    only renews the owner's lease is none)."""
    p = state.progress
    return (
        state.status,
        p.total_steps,
        p.successful_steps,
        p.failed_steps,
        p.stopped_steps,
        p.unreachable_steps,
        p.message,
    )
