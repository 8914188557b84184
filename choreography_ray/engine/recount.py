"""Recount a job from its step records: the one place an activation counts its steps again.

A new activation (after a crash, a lost write or a stop) trusts step storage over the stored
progress: it reads every step record, indexes them in the ledger and counts their outcomes
again. Stop and resume both start here, so a check on what was read belongs here too.

A job whose step records cannot all be read is never resumed or completed from part of them:
a resume loads strictly and is refused. A stop (or removal) goes on with the records it can
read, as refusing it would leave running work without a way to halt it; a removal deletes
every record, readable or not, and a stopped job still refuses to resume.
"""

from __future__ import annotations

from ..jobs.errors import UnreadableStepsError
from ..jobs.state import JobStepState
from . import progress as counting
from .activation import ActivationCore
from .ledger import Pending
from .outcomes import Outcomes
from .retrying import Decision
from .stored_steps import outcome_report


class Recount:
    """Reads the job's steps and rebuilds the ledger and the progress from them."""

    def __init__(self, core: ActivationCore, outcomes: Outcomes) -> None:
        self.core = core
        self.outcomes = outcomes

    async def load(self, *, strict: bool) -> tuple[list[JobStepState], Pending]:
        """The job's step records, and per stage what still has to run. `strict`: raise
        `UnreadableStepsError`, changing nothing, when a record cannot be read; otherwise go on
        with the readable ones and say so in the log."""
        core = self.core
        storage = core.ctx.storage.steps
        try:
            steps = await storage.get_all_for_job(core.id)
        except UnreadableStepsError as error:
            if strict:
                raise
            core.log.warning("job %s: going on without unreadable steps: %s", core.id, error)
            steps = await storage.get_for_job(core.id)
        ledger = core.ledger
        ledger.index((step.id, step.stage, step.name, step.type) for step in steps)
        outcomes, pending = ledger.reconcile(steps, self._decide)
        state = core.record.state
        started = [entry.stage for entry in state.progress.stages if entry.is_started]
        base = counting.planned(ledger.stage_sizes())
        base.message = state.progress.message
        state.progress = counting.reconcile(base, outcomes, started)
        return steps, pending

    def _decide(self, step: JobStepState) -> Decision:
        """A stored failed attempt, decided as the live run would have (`Outcomes.decide`):
        as stored when the job decided it, else now, and then stored."""
        return self.outcomes.decide(outcome_report(step, step.generation, step.attempt))
