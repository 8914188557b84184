"""Step ids the engine made, held in 16 bytes each rather than as strings of about 100.

The engine's step ids are 32 lowercase hex digits ordered by time (UUID version 7), so a
plan's ids arrive ascending. Packed as two unsigned 64-bit halves they keep that order, and
a binary search over the high halves (then the low ones among equals) finds one in C. A job
of ten million steps holds 160 MB of them here, where the strings held a gigabyte.
"""

from __future__ import annotations

import itertools
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator

_LITTLE_ENDIAN = sys.byteorder == "little"


def _hex(text: str) -> bytes | None:
    """The bytes of lowercase hex `text`; None for anything that would not read back the same
    (not hex, upper case, spaces)."""
    try:
        packed = bytes.fromhex(text)
    except ValueError:
        return None
    return packed if packed.hex() == text else None


def _halves(step_id: str) -> tuple[int, int] | None:
    """The id's two halves, or None when it is not 32 lowercase hex digits."""
    packed = _hex(step_id) if len(step_id) == 32 else None
    if packed is None:
        return None
    return int.from_bytes(packed[:8]), int.from_bytes(packed[8:])


def _packed(step_ids: list[str]) -> array[int] | None:
    """The ids' halves, high and low in turn, or None when any is not 32 lowercase hex digits
    (`_halves` of each, in a few calls for the whole list)."""
    packed = None if set(map(len, step_ids)) - {32} else _hex("".join(step_ids))
    if packed is None:
        return None
    halves = array("Q", packed)
    if _LITTLE_ENDIAN:
        halves.byteswap()  # the ids' halves are big-endian numbers
    return halves


class PackedIds:
    """Ascending step ids of 32 lowercase hex digits, as a sequence of strings."""

    __slots__ = ("_high", "_last", "_low")

    def __init__(self) -> None:
        self._high = array("Q")
        self._low = array("Q")
        self._last = ""
        """The last id added: lowercase hex of one length orders as its value does."""

    def __len__(self) -> int:
        return len(self._high)

    def __getitem__(self, at: int) -> str:
        return (self._high[at].to_bytes(8) + self._low[at].to_bytes(8)).hex()

    def __iter__(self) -> Iterator[str]:
        """Each id in order (ids added meanwhile included, as a list's iterator would)."""
        high, low, at = self._high, self._low, 0
        while at < len(high):
            yield (high[at].to_bytes(8) + low[at].to_bytes(8)).hex()
            at += 1

    def add(self, step_id: str) -> bool:
        """Append the id; False, changing nothing, when it is not hex or not above the last."""
        if step_id <= self._last:
            return False
        halves = _halves(step_id)
        if halves is None:
            return False
        self._high.append(halves[0])
        self._low.append(halves[1])
        self._last = step_id
        return True

    def add_run(self, step_ids: list[str]) -> bool:
        """Append ids that ascend, each above the last, in a few calls for the whole run (a
        chunk of a plan); False, changing nothing, when any one would not be added alone."""
        if not step_ids or step_ids[0] <= self._last:
            return not step_ids
        if any(a >= b for a, b in itertools.pairwise(step_ids)):
            return False
        halves = _packed(step_ids)
        if halves is None:
            return False
        self._high.extend(halves[0::2])
        self._low.extend(halves[1::2])
        self._last = step_ids[-1]
        return True

    def holds_run(self, at: int, step_ids: list[str]) -> bool:
        """Whether positions `at`, `at + 1`, ... hold `step_ids`, in order: compared packed,
        in a few calls for the whole run (a batch of a million-step job's records)."""
        count = len(step_ids)
        if at < 0 or at + count > len(self._high):
            return False
        halves = _packed(step_ids)
        return (
            halves is not None
            and halves[0::2] == self._high[at : at + count]
            and halves[1::2] == self._low[at : at + count]
        )

    def find(self, step_id: str) -> int:
        """The id's position; -1 when it is not here."""
        halves = _halves(step_id)
        if halves is None:
            return -1
        first, second = halves
        start = bisect_left(self._high, first)
        end = bisect_right(self._high, first, start)
        at = bisect_left(self._low, second, start, end)
        return at if at < end and self._low[at] == second else -1


class PlannedIds:
    """The step ids of a plan being checked, to find one planned twice: the engine's ids, which
    ascend, packed (a set of ten million ids held more than a gigabyte), any others in a set."""

    __slots__ = ("_others", "_packed")

    def __init__(self) -> None:
        self._packed = PackedIds()
        self._others: set[str] = set()

    def __contains__(self, step_id: object) -> bool:
        return isinstance(step_id, str) and (
            step_id in self._others or self._packed.find(step_id) >= 0
        )

    def add_all(self, step_ids: list[str]) -> str | None:
        """Note the ids; the first that was noted before (then those after it are not
        noted), or None. A plan's own ids, ascending, are packed in a few calls: none of them
        can be among the others, each of which was below the last packed id or not packable."""
        if self._packed.add_run(step_ids):
            return None
        for step_id in step_ids:
            if not self.add(step_id):
                return step_id
        return None

    def add(self, step_id: str) -> bool:
        """Note the id; False when it was noted before."""
        if step_id in self._others:
            return False
        if self._packed.add(step_id):  # above every packed id: new to them
            return True
        if self._packed.find(step_id) >= 0:
            return False
        self._others.add(step_id)
        return True
