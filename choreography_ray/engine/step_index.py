"""The steps a job's ledger knows, and which of them are counted: about 17 bytes a step.

A dict from step id to stage, a set of counted ids and the ids as strings cost about 200
bytes a step: a 10-million-step job held two gigabytes in them. Here every step is a position
in one sorted sequence of ids, found by binary search; its stage and whether it is counted
are arrays at that position (4 bytes, only when the job has several stages, and 1 byte).
Step ids the engine makes are ordered by time, so a plan's ids arrive sorted: they are packed
in 16 bytes each (`PackedIds`) and are their own search sequence. Ids a job chose itself are
held as strings from the first that does not pack, and sorted once, on the first question
after they were indexed.
"""

from __future__ import annotations

import itertools
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator, Set

from .packed_ids import PackedIds

_SPAN = 1 << 40
"""A hint is `epoch * _SPAN + position`: the position holds while the epoch does."""


class StepIndex:
    """Every step of the job in plan order, each one's stage, and the counted ones per stage."""

    def __init__(self) -> None:
        self._order: PackedIds | list[str] = PackedIds()
        """Every step id, in plan order."""
        self._plan_stages: array[int] | None = None
        """Each step's stage in plan order; None while every step is in `_first_stage`."""
        self._first_stage = 0
        self._sizes: dict[int, int] = {}
        self._in_order = True
        """Whether the ids arrived strictly increasing: `_order` is then the search list."""
        self._sorted: PackedIds | list[str] | None = None
        """The search list (built on the first question after steps were added)."""
        self._stages: array[int] | None = None
        """Each step's stage at its position in `_sorted` (None: one stage)."""
        self._counted = bytearray()
        """1 at the position of each counted step of `_sorted`."""
        self._counted_in_order: bytearray | None = None
        """1 for each step added counted, in plan order (None until one is): a recount from
        storage counts as it indexes, and the flags move to `_counted` on the first question."""
        self._unknown: set[str] = set()
        """Counted steps not indexed (counted before the plan was read, or not in it)."""
        self._per_stage: dict[int, int] = {}
        self._known_counted = 0
        self._epoch = 0
        """Moves on whenever steps may move to other positions: older hints are not used."""

    # -- indexing -------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the steps, not what is counted: their counts follow the next `add`s."""
        self._drop_search()
        self._order, self._plan_stages, self._sizes = PackedIds(), None, {}
        self._counted_in_order = None
        self._in_order, self._epoch = True, self._epoch + 1

    def _drop_search(self) -> None:
        """Let the search list go (rebuilt on the next question); counted ids wait apart."""
        self._unknown.update(self._counted_ids())
        self._sorted = self._stages = None
        self._counted, self._per_stage, self._known_counted = bytearray(), {}, 0

    def add(self, step_id: str, stage: int, counted: bool = False) -> None:
        """Know a step, after the ones known (plan order); `counted`: its outcome is.
        `add_all`'s fast path holds what this does for its steps: change one, change both."""
        order = self._order
        if self._sorted is not None:  # asked about before: searched again once complete
            self._drop_search()
        flags = self._counted_in_order
        if counted and flags is None:
            flags = self._counted_in_order = bytearray(len(order))
        if flags is not None:
            flags.append(counted)
        if not order:
            self._first_stage = stage
        stages = self._plan_stages
        if stages is None and stage != self._first_stage:
            stages = self._plan_stages = array("i", [self._first_stage]) * len(order)
        if stages is not None:
            stages.append(stage)
        if type(order) is PackedIds:
            if not order.add(step_id):  # not the engine's, or out of order: held as strings
                order = self._order = [*order, step_id]
                self._in_order = len(order) < 2 or order[-2] < step_id
        elif isinstance(order, list):
            if self._in_order and order and step_id <= order[-1]:
                self._in_order = False
            order.append(step_id)
        self._sizes[stage] = self._sizes.get(stage, 0) + 1

    def add_all(
        self, step_ids: list[str], stages: list[int], counted: Set[int] = frozenset()
    ) -> None:
        """`add` of each step in plan order, those at the positions in `counted` counted: a
        plan's part whose ids ascend in the engine's form, with none counted and every step
        in the first stage, is packed in a few calls; anything else is added one by one."""
        if len(stages) != len(step_ids):
            raise ValueError(f"{len(step_ids)} steps with {len(stages)} stages")
        if not step_ids:
            return
        order, stage = self._order, stages[0]
        if (
            not counted
            and type(order) is PackedIds
            and self._sorted is None
            and self._counted_in_order is None
            and self._plan_stages is None
            and (stage == self._first_stage or not order)
            and stages.count(stage) == len(stages)
            and order.add_run(step_ids)
        ):
            if len(order) == len(step_ids):  # they are the first
                self._first_stage = stage
            self._sizes[stage] = self._sizes.get(stage, 0) + len(step_ids)
            return
        for at, (step_id, each) in enumerate(zip(step_ids, stages, strict=True)):
            self.add(step_id, each, at in counted)

    def _search(self) -> PackedIds | list[str]:
        """The search list, built once after steps were added (with each stage and count)."""
        found = self._sorted
        if found is not None:
            return found
        order, plan_stages = self._order, self._plan_stages
        if self._in_order:
            found, self._stages = order, plan_stages
        else:
            assert isinstance(order, list)  # packed ids are in order
            found, self._epoch = sorted(order), self._epoch + 1
            if plan_stages is not None:
                stages = array("i", bytes(4 * len(order)))
                for step_id, stage in zip(order, plan_stages, strict=True):
                    stages[bisect_left(found, step_id)] = stage
                self._stages = stages
        self._sorted, self._counted = found, bytearray(len(found))
        flags, self._counted_in_order = self._counted_in_order, None
        if flags is not None:
            self._count_in_order(order, flags)
        unknown, self._unknown = self._unknown, set()
        for step_id in unknown:
            self.count(step_id)
        return found

    def _count_in_order(self, order: PackedIds | list[str], flags: bytearray) -> None:
        """Count the steps added counted, now that the search list holds them."""
        if self._in_order:
            self._counted = flags  # the same positions
            self._known_counted = flags.count(1)
            if self._plan_stages is None:
                known = self._known_counted
                self._per_stage = {self._first_stage: known} if known else {}
            else:
                self._per_stage = dict(Counter(itertools.compress(self._plan_stages, flags)))
            return
        for step_id in itertools.compress(order, flags):
            self.count(step_id)

    def find(self, step_id: str, hint: int = -1) -> int:
        """The step's position, -1 when it is not indexed. `hint` (`hint`, or `steps_of`'s)
        spares the search while the steps keep their positions."""
        found = self._search()
        if hint >= 0:
            epoch, at = divmod(hint, _SPAN)
            if epoch == self._epoch:
                return at
        if type(found) is PackedIds:
            return found.find(step_id)
        at = bisect_left(found, step_id)
        return at if at < len(found) and found[at] == step_id else -1

    @property
    def epoch(self) -> int:
        """Changes whenever steps may move to other positions (asked of the search list)."""
        self._search()
        return self._epoch

    def holds_at(self, at: int, step_id: str) -> bool:
        """Whether position `at` holds `step_id`."""
        found = self._search()
        return 0 <= at < len(found) and found[at] == step_id

    def holds_run(self, at: int, step_ids: list[str]) -> bool:
        """Whether positions `at`, `at + 1`, ... hold `step_ids`, in order."""
        found = self._search()
        if isinstance(found, PackedIds):
            return found.holds_run(at, step_ids)
        return at >= 0 and found[at : at + len(step_ids)] == step_ids

    def hint(self, at: int) -> int:
        """A hint for `find` of the step at position `at`."""
        return self._epoch * _SPAN + at if at >= 0 else -1

    def _counted_ids(self) -> Iterator[str]:
        if self._sorted is not None and self._known_counted:
            found = self._sorted
            yield from (found[at] for at, flag in enumerate(self._counted) if flag)

    # -- questions ------------------------------------------------------------------------------

    @property
    def per_stage(self) -> dict[int, int]:
        """Counted steps of each stage."""
        self._search()
        return self._per_stage

    @property
    def size(self) -> int:
        return len(self._order)

    @property
    def counted(self) -> int:
        """Steps counted, indexed or not."""
        self._search()
        return self._known_counted + len(self._unknown)

    def stage_of(self, step_id: str) -> int | None:
        """The step's stage; None when it is not indexed."""
        return self.stage_at(self.find(step_id))

    def stage_at(self, at: int) -> int | None:
        """The stage of the step at position `at` (from `find`); None for -1."""
        return self._stage(at) if at >= 0 else None

    def _stage(self, at: int) -> int:
        return self._first_stage if self._stages is None else self._stages[at]

    def is_counted(self, step_id: str, at: int | None = None) -> bool:
        """Whether the step is counted (`at`: its position, from `find`)."""
        if at is None:
            at = self.find(step_id)
        return bool(self._counted[at]) if at >= 0 else step_id in self._unknown

    def stage_sizes(self) -> dict[int, int]:
        return dict(self._sizes)

    def size_of(self, stage: int) -> int:
        return self._sizes.get(stage, 0)

    def stages(self) -> list[int]:
        return sorted(self._sizes)

    def stage_done(self, stage: int) -> bool:
        """Every step of the stage is counted."""
        self._search()
        return self._per_stage.get(stage, 0) >= self._sizes.get(stage, 0)

    def steps_of(self, stage: int) -> Iterator[tuple[str, int]]:
        """The stage's steps in plan order, each with a hint for `find` (the plan order is the
        search order when the ids came sorted; -1 when they did not)."""
        self._search()
        hints = itertools.count(self.hint(0)) if self._in_order else itertools.repeat(-1)
        order, stages = self._order, self._plan_stages
        if stages is None:
            if stage == self._first_stage:
                yield from zip(order, hints, strict=False)  # hints never end
            return
        pairs = zip(order, hints, stages, strict=False)
        yield from ((step_id, hint) for step_id, hint, of in pairs if of == stage)

    # -- counting -------------------------------------------------------------------------------

    def count(self, step_id: str, hint: int = -1) -> None:
        """The step's outcome is counted (once, however often it is told)."""
        at = self.find(step_id, hint)
        if at < 0:
            self._unknown.add(step_id)
        elif not self._counted[at]:
            self._counted[at] = 1
            self._known_counted += 1
            stage = self._stage(at)
            self._per_stage[stage] = self._per_stage.get(stage, 0) + 1

    def uncount(self, step_id: str) -> None:
        at = self.find(step_id)
        if at < 0:
            self._unknown.discard(step_id)
        elif self._counted[at]:
            self._counted[at] = 0
            self._known_counted -= 1
            self._per_stage[self._stage(at)] -= 1

    def clear_counted(self) -> None:
        self._unknown.clear()
        self._counted_in_order = None
        self._counted = bytearray(len(self._sorted)) if self._sorted is not None else bytearray()
        self._per_stage, self._known_counted = {}, 0
