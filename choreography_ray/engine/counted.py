"""The stops an execution counted, asked for every stop report in one lookup.

(What a job's outcomes count, per stage, is `StepIndex`'s.)
"""

from __future__ import annotations

from ..jobs.state import JobState


class CountedStops:
    """The steps whose stop this execution counted: the job record's `stopped_steps_counted`,
    with a set beside it.

    Asking the list and copying it for every stop made a stop of N steps cost O(N²): about a
    minute at 100,000 steps. The set follows the list it was built from; a list put in its
    place (a recount, a resume) is read again on the next question."""

    def __init__(self) -> None:
        self._of: list[str] | None = None
        self._ids: set[str] = set()

    def _view(self, state: JobState) -> set[str]:
        if self._of is not state.stopped_steps_counted:
            self._of = state.stopped_steps_counted
            self._ids = set(self._of)
        return self._ids

    def has(self, state: JobState, step_id: str) -> bool:
        return step_id in self._view(state)

    def add(self, state: JobState, step_id: str) -> bool:
        """Count the step's stop; False when it was counted already. The list grows in
        place: every write of the record encodes it as it stands, within the job's turn."""
        ids = self._view(state)
        if step_id in ids:
            return False
        ids.add(step_id)
        state.stopped_steps_counted.append(step_id)
        return True

    def discard(self, state: JobState, step_id: str) -> bool:
        """Take the step's counted stop back; False when none was counted."""
        ids = self._view(state)
        if step_id not in ids:
            return False
        ids.discard(step_id)
        state.stopped_steps_counted = [s for s in state.stopped_steps_counted if s != step_id]
        self._of = state.stopped_steps_counted
        return True
