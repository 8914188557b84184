"""Step ids the engine made, held in 16 bytes each rather than as strings of about 100.

The engine's step ids are 32 lowercase hex digits ordered by time (UUID version 7), so a
plan's ids arrive ascending. Packed as two unsigned 64-bit halves they keep that order, and
a binary search over the high halves (then the low ones among equals) finds one in C. A job
of ten million steps holds 160 MB of them here, where the strings held a gigabyte.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator


def _halves(step_id: str) -> tuple[int, int] | None:
    """The id's two halves, or None when it is not 32 lowercase hex digits."""
    if len(step_id) != 32:
        return None
    try:
        packed = bytes.fromhex(step_id)
    except ValueError:
        return None
    if packed.hex() != step_id:  # upper case or spaces: it would not read back the same
        return None
    return int.from_bytes(packed[:8]), int.from_bytes(packed[8:])


class PackedIds:
    """Ascending step ids of 32 lowercase hex digits, as a sequence of strings."""

    __slots__ = ("_high", "_low")

    def __init__(self) -> None:
        self._high = array("Q")
        self._low = array("Q")

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
        halves = _halves(step_id)
        if halves is None:
            return False
        high, low = self._high, self._low
        if high and halves <= (high[-1], low[-1]):
            return False
        high.append(halves[0])
        low.append(halves[1])
        return True

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
