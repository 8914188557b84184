"""The step ledger of a job's activation: which steps it knows, where each one stands.

After Ray Serve's `ReplicaStateContainer`: the ledger alone holds the steps' states, and each
change of state is one of its methods. A step is

- **waiting** to be sent (`queue`, or `open` for a stage's steps), then
- **tracked** once its start is sent (`start`), or kept tracked by a stop until its worker
  was told (`stop`), and
- **counted** once its outcome is (`settle`); a failed attempt to be tried again is
  **retrying** meanwhile (`retry`), then waiting again (`retry_due`).

`forget` drops a tracked step whose run is gone (lost, moved, undelivered), `drain` takes
everything not yet running out for a stop. Other modules ask by state (`is_counted`,
`entry`, `started_before`, ...) and never reach into the collections. The stage cursor
(`current`) is the stage the job is running. The ledger writes nothing and awaits nothing:
the lifecycle operations decide, the ledger remembers.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from ..jobs.state import JobState, JobStepState
from ..jobs.status import FAILED_STEP_STATUSES, JobStepStatus
from .counted import CountedStops
from .fresh import FreshRecords
from .messages import StepStart
from .retrying import Decision, Verdict
from .step_index import StepIndex
from .step_types import StepTypes
from .waiting import Waiting


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
    at: int = -1  # where the ledger's index has the step (a hint): its outcome is counted there


class StepLedger:
    """Which steps are tracked, waiting, retrying or counted, in which stage and attempt."""

    def __init__(self) -> None:
        self._steps = StepIndex()
        self._names: dict[str, str] = {}
        """The steps that have a name."""
        self._types = StepTypes()
        self._tracked: dict[str, Tracked] = {}
        self._next_attempt: dict[str, int] = {}
        self._waiting = Waiting(self._next_attempt)
        self._held: dict[str, deque[tuple[str, int]]] = {}
        """Waiting steps a class's window held back (`start`'s gate), by type, in order."""
        self._stops = CountedStops()
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._sticky: dict[str, str] = {}
        """Steps whose next start goes back to the host their run was found on (never doubled)."""
        self._urgent: set[str] = set()
        """Steps sent again after their run was lost: their next start is urgent."""
        self._losses: list[str] = []
        """Worker hosts lost, in order: a dispatch answered after a loss sends theirs again."""
        self._fresh = FreshRecords()
        """Steps this activation prepared and stored, not yet started: the first start of each
        carries its record, which the worker then need not read back (forgotten when the
        ledger is recounted from storage)."""
        self._due: dict[str, tuple[int, datetime | None]] = {}
        """Failed attempts a recount decided to retry: next attempt and when due (`take_due`)."""
        self._current: int | None = None
        self._loaded = False

    # -- queries ----------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        """Whether the steps are indexed (from the plan or from storage)."""
        return self._loaded

    @property
    def current(self) -> int | None:
        """The stage cursor: the stage being run, None before the first one opens."""
        return self._current

    @property
    def types(self) -> StepTypes:
        """Each step's type: the dispatcher sends a step only to a host that runs its type."""
        return self._types

    def stage_of(self, step_id: str) -> int:
        stage = self._steps.stage_of(step_id)
        return 0 if stage is None else stage

    def name_of(self, step_id: str) -> str:
        return self._names.get(step_id, "")

    def is_counted(self, step_id: str) -> bool:
        entry = self._tracked.get(step_id)  # every report asks: its start's hint spares a search
        return self._steps.is_counted(step_id, self._steps.find(step_id, entry.at if entry else -1))

    def entry(self, step_id: str) -> Tracked | None:
        """The step's tracked start, if it is tracked."""
        return self._tracked.get(step_id)

    @property
    def has_tracked(self) -> bool:
        """A start was sent (or a stop is not yet told) and no outcome counted for it."""
        return bool(self._tracked)

    @property
    def queued(self) -> int:
        """Steps waiting to be sent."""
        return len(self._waiting) + sum(map(len, self._held.values()))

    @property
    def outstanding(self) -> int:
        """Steps with no outcome counted yet."""
        return max(0, self._steps.size - self._steps.counted)

    @property
    def has_work(self) -> bool:
        """Steps are tracked, waiting to be sent or waiting out a backoff in this activation."""
        return bool(self._tracked or self._retries or self.queued)

    def room(self, window: int | None) -> int:
        """How many more starts the job's window allows (every waiting one without a window)."""
        if window is None:
            return len(self._waiting)
        return max(0, window - len(self._tracked) - len(self._retries))

    def active(self) -> list[str]:
        """The steps started or waiting out a retry's backoff: what a window holds."""
        return [*self._tracked, *self._retries]

    def hosts_in_use(self) -> set[str]:
        """The worker hosts that took a tracked start."""
        return {entry.host for entry in self._tracked.values() if entry.host}

    def started_before(self, cutoff: datetime) -> dict[str, tuple[str, int]]:
        """The tracked starts sent at or before `cutoff`: host and attempt of each."""
        return {
            step_id: (entry.host, entry.attempt)
            for step_id, entry in self._tracked.items()
            if entry.since is not None and entry.since <= cutoff
        }

    @property
    def losses(self) -> int:
        """How many worker hosts this activation was told it lost."""
        return len(self._losses)

    def stop_counted(self, state: JobState, step_id: str) -> bool:
        """Whether this execution counted the step's stop."""
        return self._stops.has(state, step_id)

    # -- the plan and the stages ----------------------------------------------------------------

    def index(
        self,
        steps: Iterable[tuple[str, int, str, str]],
        *,
        more: bool = False,
        counted: Container[str] = frozenset(),
    ) -> None:
        """Know the job's steps as (id, stage, name, type), from its plan or its records (`more`:
        a next part); those in `counted` have their outcome counted."""
        if not more:
            self._steps.reset()
            self._types = StepTypes()
        index, types = self._steps, self._types
        others, names = types.others, self._names
        ids: list[str] = []  # added together (`StepIndex.add_all`)
        stages: list[int] = []
        counted_at: set[int] = set()
        for step_id, stage, name, step_type in steps:
            if step_id in counted:
                counted_at.add(len(ids))
            ids.append(step_id)
            stages.append(stage)
            if name:  # most steps have none; a million empty entries would hold ~100 MB
                names[step_id] = name
            if step_type != types.default:  # `StepTypes.add`, inline: once per step
                if types.default:
                    others[step_id] = step_type
                else:
                    types.default = step_type
        index.add_all(ids, stages, counted_at)
        self._loaded = True

    def stage_sizes(self) -> dict[int, int]:
        return self._steps.stage_sizes()

    def stages(self) -> list[int]:
        return self._steps.stages()

    def stage_done(self, stage: int) -> bool:
        return self._steps.stage_done(stage)

    def first_open_stage(self) -> int | None:
        return next((stage for stage in self.stages() if not self.stage_done(stage)), None)

    def open(self, stage: int) -> None:
        """Move the cursor to `stage`; its steps not tracked nor retrying now, and not counted
        when taken, go after the queued ones (read from the index as they go, not copied)."""
        self._current = stage
        skip = frozenset([*self._tracked, *self._retries])
        self._waiting.open(self._steps.steps_of(stage), self._steps.size_of(stage), skip)

    def uncounted(self, stage: int) -> Iterator[str]:
        """The stage's steps that have no outcome yet."""
        index = self._steps
        for step_id, hint in index.steps_of(stage):
            if not index.is_counted(step_id, index.find(step_id, hint)):
                yield step_id

    def uncounted_after(self, stage: int) -> list[str]:
        """The steps of every later stage that have no outcome yet."""
        return [
            step_id for later in self.stages() if later > stage for step_id in self.uncounted(later)
        ]

    # -- transitions ------------------------------------------------------------------------

    def keep_fresh(self, records: list[JobStepState], versions: list[int]) -> None:
        """Remember records just prepared and stored: their first start carries them."""
        self._fresh.keep(records, versions, self._steps, self._names, self._types)

    def queue(self, steps: Iterable[tuple[str, int]], *, urgent: bool = False) -> int:
        """Queue steps (id, attempt) ahead of the others, in order; counted steps are
        skipped, and a step tracked by then is not started twice (`start` skips it).
        `urgent`: sent again after their run was lost. Returns how many were queued."""
        counted = self._steps.is_counted
        again = [(step_id, attempt) for step_id, attempt in steps if not counted(step_id)]
        self._waiting.first(again)
        if urgent:
            self._urgent.update(step_id for step_id, _ in again)
        return len(again)

    def start(
        self, room: int, generation: int, now: datetime, gate: Callable[[str], bool] | None = None
    ) -> tuple[list[StepStart], dict[str, str]]:
        """Take up to `room` waiting steps and track them as started in `generation`: their
        starts, and the hosts some go back to. A step of a type `gate` refuses (its class's
        window is full) is held, in order, and goes first once its class has room."""
        chosen: list[StepStart] = []
        waiting, tracked, take = self._waiting, self._tracked, self._waiting.take
        index = self._steps
        find, counted, stage_at = index.find, index.is_counted, index.stage_at
        take_fresh, names, urgent = self._fresh.take, self._names, self._urgent
        held, types, admitted = self._held, self._types, list[tuple[str, int]]()
        for step_type, steps in held.items() if gate else ():
            while steps and len(admitted) < room and gate(step_type):  # type: ignore[misc]
                admitted.append(steps.popleft())
        waiting.first(admitted)  # ahead of the others, in their order
        passed = {step_id for step_id, _ in admitted}
        while len(chosen) < room and (taken := take()) is not None:
            step_id, attempt, hint = taken
            at = find(step_id, hint)
            if counted(step_id, at) or step_id in tracked:
                continue
            if gate and step_id not in passed and not gate(step_type := types.of(step_id)):
                held.setdefault(step_type, deque()).append((step_id, attempt))
                continue
            again = bool(urgent) and step_id in urgent
            if again:
                urgent.discard(step_id)
            stage, hint = stage_at(at) or 0, index.hint(at)
            record = take_fresh(step_id, at, stage, index, types, names)
            chosen.append(StepStart(step_id, generation, attempt, record, again))
            tracked[step_id] = Tracked(stage, attempt, generation, since=now, at=hint)
        sticky: dict[str, str] = {}
        if self._sticky:
            for start in chosen:
                host = self._sticky.pop(start.step_id, None)
                if host is not None:
                    sticky[start.step_id] = host
        return chosen, sticky

    def place(self, hosts: Mapping[str, list[str]], generation: int) -> None:
        """Record which worker host took which of this execution's starts."""
        tracked = self._tracked
        for host, step_ids in hosts.items():
            for step_id in step_ids:
                entry = tracked.get(step_id)
                if entry is not None and entry.generation == generation:
                    entry.host = host

    def runs_on(self, step_id: str, host: str) -> None:
        """The step's live run is on `host` (not the one asked): it reports from there."""
        entry = self._tracked.get(step_id)
        if entry is not None:
            entry.host = host

    def pin(self, hosts: Mapping[str, str]) -> None:
        """The next start of each step goes back to its host (where its run was found)."""
        self._sticky.update(hosts)

    def move(self, step_ids: Iterable[str], to: list[str]) -> int:
        """Runs handed back by their hosts, not started: queued first and urgent, spread over
        the hosts `to` (or wherever dispatch places them). Returns how many moved."""
        moved = []
        for step_id in step_ids:
            entry = self._tracked.pop(step_id, None)
            if entry is not None and not self._steps.is_counted(step_id):
                moved.append((step_id, entry.attempt))
                if to:
                    self._sticky[step_id] = to[len(moved) % len(to)]
        return self.queue(moved, urgent=True)

    def settle(self, step_id: str) -> None:
        """The step's outcome is counted."""
        entry = self._tracked.pop(step_id, None)
        self._steps.count(step_id, -1 if entry is None else entry.at)

    def count_stop(self, state: JobState, step_id: str) -> bool:
        """List the step's stop in the job's record, once per execution; False if listed."""
        return self._stops.add(state, step_id)

    def take_back_stop(self, state: JobState, step_id: str) -> bool:
        """A counted stop is replaced by the outcome that followed it: the step is no longer
        counted, nor its stop listed. False when no stop of it was counted."""
        if not self._stops.discard(state, step_id):
            return False
        self._steps.uncount(step_id)
        return True

    def retry(self, step_id: str, timer: asyncio.Task[None]) -> None:
        """A failed attempt waits out its backoff (`timer`) before it is queued again."""
        self._tracked.pop(step_id, None)
        self._retries[step_id] = timer

    def retry_due(self, step_id: str) -> None:
        """The step's backoff passed: it is no longer retrying (its caller queues it)."""
        self._retries.pop(step_id, None)

    def is_retrying(self, step_id: str) -> bool:
        return step_id in self._retries

    def take_due(self) -> dict[str, tuple[int, datetime | None]]:
        """The retries the last recount found decided, each taken once, to schedule."""
        due, self._due = self._due, {}
        return due

    def stop(self, step_ids: Iterable[str], generation: int) -> None:
        """Keep steps a stop must reach tracked until each is accounted for (told, or its
        answer counted), so nothing finalizes the stop while their work may run."""
        tracked = self._tracked
        for step_id in step_ids:
            if step_id not in tracked:
                tracked[step_id] = Tracked(self.stage_of(step_id), 1, generation)

    def forget(self, step_id: str) -> Tracked | None:
        """Drop the step's tracked start (its run is gone, moved or accounted for)."""
        return self._tracked.pop(step_id, None)

    def drain(self) -> set[str]:
        """Every step that may run or is about to: tracked, waiting or retrying. Retries are
        cancelled and the queue emptied, so nothing more is sent."""
        steps = set(self._tracked) | set(self._retries)
        counted = self._steps.is_counted
        steps.update(step_id for step_id in self._waiting.drain() if not counted(step_id))
        steps.update(step_id for held in self._held.values() for step_id, _ in held)
        self.cancel_retries()
        self._held.clear()
        self._due.clear()
        return steps

    def cancel_retries(self) -> None:
        for task in self._retries.values():
            task.cancel()
        self._retries.clear()

    def lose(self, hosts: Iterable[str]) -> list[tuple[str, int]]:
        """Forget the starts that went to `hosts`, which are gone; they are to be sent again
        (same attempt: the run was interrupted, it did not fail)."""
        gone = set(hosts)
        self._losses.extend(sorted(gone))
        return self._forget_on(gone)

    def lose_again(self, since: int) -> list[tuple[str, int]]:
        """Apply the losses after the first `since` again, to answers that came after them."""
        return self._forget_on(set(self._losses[since:]))

    def _forget_on(self, gone: set[str]) -> list[tuple[str, int]]:
        lost = [(step_id, e.attempt) for step_id, e in self._tracked.items() if e.host in gone]
        for step_id, _ in lost:
            del self._tracked[step_id]
        for step_id in [s for s, host in self._sticky.items() if host in gone]:
            del self._sticky[step_id]
        return lost

    # -- recount ------------------------------------------------------------------------------

    def begin_recount(self) -> None:
        """Forget what ran and what is known: the steps are indexed and counted again from
        their records (`recount`, a part at a time). Until then nothing is `loaded`."""
        self._steps.clear_counted()
        self._steps.reset()
        self._types = StepTypes()
        for held in (self._due, self._tracked, self._held, self._sticky, self._next_attempt):
            held.clear()  # in place: the waiting steps read the next attempts
        self._waiting.clear()
        self._urgent.clear()
        self._fresh.clear()
        self._current = None
        self._loaded = False

    def recount(
        self,
        steps: Sequence[JobStepState],
        decide: Callable[[JobStepState], Decision],
        outcomes: Counter[tuple[int, JobStepStatus]],
    ) -> None:
        """Index and count a part of the job's records, in step-id order after the parts
        before: a stored outcome is counted in `outcomes` by (stage, status), a failed attempt
        as `decide` says (a retry is due at its time: `take_due`); any other step runs."""
        counted: set[str] = set()
        for step in steps:
            status = step.status
            if status in (JobStepStatus.COMPLETED_SUCCESSFULLY, JobStepStatus.UNREACHABLE):
                outcomes[step.stage, status] += 1
                counted.add(step.id)
                continue
            attempt = max(1, step.attempt)
            if status in FAILED_STEP_STATUSES:
                self._types.add(step.id, step.type)  # the decision is the step type's
                decision = decide(step)
                if decision.verdict is not Verdict.RETRY:
                    outcomes[step.stage, JobStepStatus.FAILED] += 1
                    counted.add(step.id)
                    continue
                attempt = step.attempt + 1
                self._due[step.id] = (attempt, decision.at)
            # Unknown, Scheduled, Running, Stopped: stored state is no proof that it runs.
            elif status == JobStepStatus.RUNNING and step.lease is not None and step.lease.host:
                self._sticky[step.id] = step.lease.host
            if attempt != 1:
                self._next_attempt[step.id] = attempt
        self.index(((s.id, s.stage, s.name, s.type) for s in steps), more=True, counted=counted)
