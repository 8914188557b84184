"""The steps of a job waiting to be sent, in the order they go.

Steps queued one by one (sent again, moved, retried) go first, in the order they were put
there; then the open stages' steps, in plan order. A stage is not copied into a queue when it
opens: its steps are read from the ledger's index as they are sent, so a stage of ten million
steps costs nothing here (a queue of (id, attempt) pairs held 640 MB of it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator


class _Opened:
    """An open stage's steps not sent yet; `left` bounds how many remain."""

    __slots__ = ("left", "steps")

    def __init__(self, steps: Iterator[tuple[str, int]], left: int) -> None:
        self.steps, self.left = steps, left


class Waiting:
    """Steps to send with the attempt each runs: the queued ones, then the open stages'."""

    def __init__(self, attempts: dict[str, int]) -> None:
        self._queued: deque[tuple[str, int]] = deque()
        self._opened: deque[_Opened] = deque()
        self._attempts = attempts
        """The attempt an open stage's step runs next, when not 1 (a recount's, kept by the
        ledger: the same dict, changed in place)."""

    def __len__(self) -> int:
        """How many are left to send, at most: some may be counted by the time they would go."""
        return len(self._queued) + sum(opened.left for opened in self._opened)

    def first(self, steps: Iterable[tuple[str, int]]) -> None:
        """Put steps ahead of every waiting one, in their order."""
        self._queued.extendleft(reversed(list(steps)))

    def open(self, steps: Iterator[tuple[str, int]], size: int, skip: frozenset[str]) -> None:
        """Send a stage's `size` steps (id, where the index has it) after the others, except
        those in `skip`."""
        self._opened.append(_Opened((step for step in steps if step[0] not in skip), size))

    def take(self) -> tuple[str, int, int] | None:
        """The next step to send, its attempt and where the index has it (-1: not known);
        None when none waits."""
        if self._queued:
            return (*self._queued.popleft(), -1)
        opened = self._opened
        while opened:
            first = opened[0]
            step = next(first.steps, None)
            if step is not None:
                first.left -= 1
                return step[0], self._attempts.get(step[0], 1), step[1]
            opened.popleft()
        return None

    def drain(self) -> Iterator[str]:
        """Every waiting step, taken: nothing waits after it."""
        while (taken := self.take()) is not None:
            yield taken[0]

    def clear(self) -> None:
        self._queued.clear()
        self._opened.clear()
