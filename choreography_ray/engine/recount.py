"""Recount a job from its step records: the one place an activation counts its steps again.

A new activation (after a crash, a lost write or a stop) trusts step storage over the stored
progress: it reads every step record, a part at a time, indexes them in the ledger and counts
their outcomes again. Stop and resume both start here, so a check on what was read belongs here too.

A job whose step records cannot all be read is never resumed or completed from part of them:
a resume loads strictly and is refused. A stop (or removal) goes on with the records it can
read, as refusing it would leave running work without a way to halt it; a removal deletes
every record, readable or not, and a stopped job still refuses to resume.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from ..jobs.errors import UnreadableStepsError
from ..jobs.state import JobStepState
from ..jobs.status import JobStepStatus
from ..storage.protocols import step_parts
from . import progress as counting
from .activation import ActivationCore
from .outcomes import Outcomes
from .retrying import Decision
from .stored_steps import outcome_report


class Recount:
    """Reads the job's steps and rebuilds the ledger and the progress from them."""

    def __init__(self, core: ActivationCore, outcomes: Outcomes) -> None:
        self.core = core
        self.outcomes = outcomes

    async def read(self, each: Callable[[list[JobStepState]], None], *, strict: bool) -> None:
        """Show `each` the job's readable step records, a part at a time (`step_parts`), each
        let go after it: a job of millions of steps is never held whole (about 8 KB a record
        decoded). A record that cannot be read, after all were read: `strict` raises
        `UnreadableStepsError` naming each, otherwise the log says so."""
        core = self.core
        unreadable: dict[str, str] = {}
        async for part in step_parts(core.ctx.storage.steps, core.id):
            each(part.steps)
            unreadable.update(part.unreadable)
        if unreadable:
            error = UnreadableStepsError(core.id, unreadable)
            if strict:
                raise error
            core.log.warning("job %s: going on without unreadable steps: %s", core.id, error)

    async def load(
        self, *, strict: bool, each: Callable[[JobStepState], None] | None = None
    ) -> None:
        """Index and count the job's step records again (`read`, `strict` as there, a refusal
        leaving the ledger knowing nothing, so that nothing counts until a recount succeeds),
        and rebuild the job's progress from them; `each` is shown every readable record. The
        ledger keeps about 17 bytes a step of them."""
        core = self.core
        ledger = core.ledger
        ledger.begin_recount()
        outcomes: Counter[tuple[int, JobStepStatus]] = Counter()

        def part(steps: list[JobStepState]) -> None:
            ledger.recount(steps, self._decide, outcomes)
            if each is not None:
                for step in steps:
                    each(step)

        try:
            await self.read(part, strict=strict)
        except UnreadableStepsError:
            ledger.begin_recount()
            raise
        if not ledger.loaded:
            ledger.index(())  # a job with no step records
        state = core.record.state
        started = [entry.stage for entry in state.progress.stages if entry.is_started]
        base = counting.planned(ledger.stage_sizes())
        base.message = state.progress.message
        state.progress = counting.reconcile(base, outcomes, started)

    def _decide(self, step: JobStepState) -> Decision:
        """A stored failed attempt, decided as the live run would have (`Outcomes.decide`):
        as stored when the job decided it, else now, and then stored."""
        return self.outcomes.decide(outcome_report(step, step.generation, step.attempt))
