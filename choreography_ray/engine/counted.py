"""What the step ledger counts: outcomes per stage and the stops an execution counted.

Both answer in one lookup what a scan of a stage or of the job's record would answer: they
are asked for every outcome and every stop, and a scan made large jobs quadratic.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet

from ..jobs.state import JobState


class Counted(set[str]):
    """The steps whose outcome is counted, with how many of each stage are.

    A stage is done when all its steps are counted; asking that by scanning the stage made
    every batch of outcomes cost a pass over the stage (quadratic in the job's size: a quarter
    of a 30,000-step job's controller time). The per-stage counts make it one lookup."""

    def __init__(self, stage_of: dict[str, int]) -> None:
        super().__init__()
        self._stage_of = stage_of
        self.per_stage: dict[int, int] = {}

    def add(self, step_id: str) -> None:
        if step_id not in self:
            super().add(step_id)
            stage = self._stage_of.get(step_id)
            if stage is not None:
                self.per_stage[stage] = self.per_stage.get(stage, 0) + 1

    def discard(self, step_id: object) -> None:
        if isinstance(step_id, str) and step_id in self:
            super().discard(step_id)
            stage = self._stage_of.get(step_id)
            if stage is not None:
                self.per_stage[stage] -= 1

    def remove(self, step_id: str) -> None:
        if step_id not in self:
            raise KeyError(step_id)
        self.discard(step_id)

    def update(self, *others: Iterable[str]) -> None:
        for other in others:
            for step_id in other:
                self.add(step_id)

    def __ior__(self, other: AbstractSet[str]) -> Counted:  # type: ignore[override,misc]
        self.update(other)
        return self

    def clear(self) -> None:
        super().clear()
        self.per_stage.clear()

    def recount(self) -> None:
        """Count per stage again (the steps' stages became known after they were counted)."""
        self.per_stage = {}
        for step_id in self:
            stage = self._stage_of.get(step_id)
            if stage is not None:
                self.per_stage[stage] = self.per_stage.get(stage, 0) + 1


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
