"""Exponential backoff: the one schedule every retry loop of the package waits by.

A loop asks `next()` for how long to wait before its next try and calls `reset()` once a try
succeeds. The delays start at `initial`, grow by `coefficient` and stop growing at `maximum`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta


@dataclass
class Backoff:
    """The delays between the tries of one retry loop, growing from `initial` to `maximum`."""

    initial: float
    maximum: float
    coefficient: float = 2.0
    _next: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < self.initial or self.coefficient < 1:
            raise ValueError(
                f"backoff: needs 0 <= initial <= maximum and coefficient >= 1, got "
                f"initial={self.initial}, maximum={self.maximum}, coefficient={self.coefficient}"
            )
        self._next = self.initial

    @classmethod
    def between(cls, initial: timedelta, maximum: timedelta) -> Backoff:
        return cls(initial.total_seconds(), max(initial, maximum).total_seconds())

    def next(self) -> float:
        """The wait before the next try, in seconds; the one after it is longer."""
        delay = self._next
        self._next = min(self.maximum, delay * self.coefficient)
        return delay

    def peek(self) -> float:
        """The wait `next()` would answer, without moving on."""
        return self._next

    def reset(self) -> None:
        """A try succeeded: the next failure waits `initial` again."""
        self._next = self.initial
