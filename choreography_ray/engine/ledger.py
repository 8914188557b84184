"""The step ledger of a job's activation: which steps it knows, where each one stands.

One object answers, for every step of the job: its stage and name, whether it is tracked (a
start was sent and no outcome counted), waiting to be sent, waiting out a retry's backoff, or
counted. The stage cursor (`current`) is the stage the job is running. The ledger writes
nothing and awaits nothing: the lifecycle operations decide, the ledger remembers.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime

from ..jobs.state import JobState, JobStepState
from ..jobs.status import FAILED_STEP_STATUSES, JobStepStatus
from .messages import Prepared
from .step_types import StepTypes

FRESH_LIMIT = 100_000
"""Prepared records a job keeps for its first starts: about 30 MB at most."""

Pending = dict[int, list[tuple[str, int]]]
"""Per stage, the steps still to run and the attempt each runs next."""


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


@dataclass
class Tracked:
    """A step whose start was sent in this execution and whose outcome is not counted yet."""

    stage: int
    attempt: int
    generation: int
    host: str = ""
    """The worker host that took the start; empty until it answered."""
    since: datetime | None = None
    """When the start was sent (the watchdog looks only at starts older than its quiet time)."""


class StepLedger:
    """Which steps are tracked, waiting, retrying or counted, in which stage and attempt."""

    def __init__(self) -> None:
        self.stage_steps: dict[int, list[str]] = {}
        self.stage_of: dict[str, int] = {}
        self.names: dict[str, str] = {}
        """The steps that have a name (read with `.get(step_id, "")`)."""
        self.types = StepTypes()
        """Each step's type: the dispatcher sends a step only to a host that runs its type."""
        self.tracked: dict[str, Tracked] = {}
        self.waiting: deque[tuple[str, int]] = deque()
        self.counted = Counted(self.stage_of)
        self.stops = CountedStops()
        self.next_attempt: dict[str, int] = {}
        self.retries: dict[str, asyncio.Task[None]] = {}
        self.sticky: dict[str, str] = {}
        """Steps whose last run a recount found on a worker host (its stored lease): the next
        start goes back to that host while it lives, so a run is never doubled elsewhere."""
        self.urgent: set[str] = set()
        """Steps sent again after their run was lost: their next start is urgent."""
        self.losses: list[str] = []
        """Every worker host this activation was told it lost, in order: a dispatch answered
        after a loss sends again what went to that host."""
        self.fresh: dict[str, Prepared] = {}
        """Steps this activation prepared and stored, not yet started: the first start of each
        carries its record, which the worker then need not read back (at most `FRESH_LIMIT`;
        forgotten when the ledger is recounted from storage)."""
        self.current: int | None = None
        """The stage cursor: the stage being run, None before the first one opens."""
        self.loaded = False
        """Whether the steps are indexed (from the plan or from storage)."""

    # -- the plan -----------------------------------------------------------------------------

    def index(self, steps: Iterable[tuple[str, int, str, str]]) -> None:
        """Know the job's steps as (id, stage, name, type), from its plan or from step
        storage."""
        self.stage_steps = {}
        self.types = types = StepTypes()
        others = types.others
        stage_of, names = self.stage_of, self.names
        for step_id, stage, name, step_type in steps:
            self.stage_steps.setdefault(stage, []).append(step_id)
            stage_of[step_id] = stage
            if name:  # most steps have none; a million empty entries would hold ~100 MB
                names[step_id] = name
            if step_type != types.default:  # `StepTypes.add`, inline: once per step
                if types.default:
                    others[step_id] = step_type
                else:
                    types.default = step_type
        self.counted.recount()
        self.loaded = True

    def stage_sizes(self) -> dict[int, int]:
        return {stage: len(ids) for stage, ids in self.stage_steps.items()}

    # -- the stage cursor ---------------------------------------------------------------------

    def stages(self) -> list[int]:
        return sorted(self.stage_steps)

    def stage_done(self, stage: int) -> bool:
        return self.counted.per_stage.get(stage, 0) >= len(self.stage_steps.get(stage, ()))

    def first_open_stage(self) -> int | None:
        for stage in self.stages():
            if not self.stage_done(stage):
                return stage
        return None

    def open(self, stage: int) -> None:
        """Move the cursor to `stage` and queue its steps that are neither counted nor tracked."""
        self.current = stage
        self.waiting.extend(
            (step_id, self.next_attempt.get(step_id, 1))
            for step_id in self.stage_steps.get(stage, ())
            if step_id not in self.counted and step_id not in self.tracked
        )

    def uncounted_after(self, stage: int) -> list[str]:
        """The steps of every later stage that have no outcome yet."""
        return [
            step_id
            for later in self.stages()
            if later > stage
            for step_id in self.stage_steps[later]
            if step_id not in self.counted
        ]

    # -- what runs ----------------------------------------------------------------------------

    def room(self, window: int | None) -> int:
        """How many more starts the job's window allows (every waiting one without a window)."""
        if window is None:
            return len(self.waiting)
        return max(0, window - len(self.tracked) - len(self.retries))

    @property
    def has_work(self) -> bool:
        """Steps are tracked, waiting to be sent or waiting out a backoff in this activation."""
        return bool(self.tracked or self.waiting or self.retries)

    def place(self, hosts: dict[str, list[str]], generation: int) -> None:
        """Record which worker host took which of this execution's starts."""
        tracked = self.tracked
        for host, step_ids in hosts.items():
            for step_id in step_ids:
                entry = tracked.get(step_id)
                if entry is not None and entry.generation == generation:
                    entry.host = host

    def lose(self, hosts: Iterable[str], *, again: bool = False) -> list[tuple[str, int]]:
        """Forget the starts that went to `hosts`, which are gone; they are to be sent again
        (same attempt: the run was interrupted, it did not fail). `again`: a loss already
        recorded, applied to answers that came back after it."""
        gone = set(hosts)
        if not again:
            self.losses.extend(sorted(gone))
        lost = [
            (step_id, entry.attempt)
            for step_id, entry in self.tracked.items()
            if entry.host in gone
        ]
        for step_id, _ in lost:
            del self.tracked[step_id]
        for step_id in [s for s, host in self.sticky.items() if host in gone]:
            del self.sticky[step_id]
        return lost

    def cancel_retries(self) -> None:
        for task in self.retries.values():
            task.cancel()
        self.retries.clear()

    def take_in_flight(self) -> set[str]:
        """Every step that may run or is about to: tracked, waiting or retrying. Retries are
        cancelled and the queue emptied, so nothing more is sent."""
        steps = set(self.tracked) | set(self.retries)
        steps.update(step_id for step_id, _ in self.waiting)
        self.cancel_retries()
        self.waiting.clear()
        return steps

    # -- recount ------------------------------------------------------------------------------

    def reconcile(
        self, steps: Iterable[JobStepState], would_retry: Callable[[JobStepState], bool]
    ) -> tuple[list[tuple[int, JobStepStatus]], Pending]:
        """Forget what ran; count stored outcomes again. Returns the outcomes and what each
        stage still has to run."""
        self.counted.clear()
        self.tracked.clear()
        self.waiting.clear()
        self.sticky.clear()
        self.urgent.clear()
        self.fresh.clear()
        outcomes: list[tuple[int, JobStepStatus]] = []
        pending: Pending = {}
        for step in steps:
            status = step.status
            if status in (JobStepStatus.COMPLETED_SUCCESSFULLY, JobStepStatus.UNREACHABLE):
                outcomes.append((step.stage, status))
                self.counted.add(step.id)
            elif status in FAILED_STEP_STATUSES:
                if status == JobStepStatus.COMPLETED_WITH_FAILURE and would_retry(step):
                    pending.setdefault(step.stage, []).append((step.id, step.attempt + 1))
                else:
                    outcomes.append((step.stage, JobStepStatus.FAILED))
                    self.counted.add(step.id)
            else:
                # Unknown, Scheduled, Running, Stopped: stored state is no proof that it runs.
                pending.setdefault(step.stage, []).append((step.id, max(1, step.attempt)))
                if status == JobStepStatus.RUNNING and step.lease is not None and step.lease.host:
                    self.sticky[step.id] = step.lease.host
        self.current = None
        self.next_attempt = {
            step_id: attempt
            for stage_pending in pending.values()
            for step_id, attempt in stage_pending
        }
        return outcomes, pending
