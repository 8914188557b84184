"""Rate limits per step type: at most N runs of a step type begin per period, across the
cluster, with a bounded burst. A run that would exceed the limit waits for its turn; it never
fails for it.

    class CallPartnerApi(JobStep[Call, Call, Answer], name="partner-api"):
        rate_limit = "100/s"          # or "5000/h", or RateLimit(100, per=1.0, burst=20)

How the limit is kept is the worker's (`engine.rates`); docs/scheduling.md says what it
guarantees.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from .errors import TypeRegistryError

_PERIODS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([a-z]+)\s*$")

RATE_LIMITED: set[str] = set()
"""The names of the step types declared with a rate limit in this process: while it is empty,
a worker looks at no run's type for a limit."""


@dataclass(frozen=True)
class RateLimit:
    """`count` runs begin per `per` seconds at most; up to `burst` at once after a quiet
    while (default: one second's worth, at least 1)."""

    count: float
    per: float = 1.0
    burst: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("count", self.count), ("per", self.per)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeRegistryError(f"a rate limit's {name} is a number, not {value!r}")
            if not 0 < value < math.inf:
                raise TypeRegistryError(f"a rate limit's {name} must be positive, not {value!r}")
        if self.burst is not None and (
            isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1
        ):
            raise TypeRegistryError(
                f"a rate limit's burst is a whole number >= 1, not {self.burst!r}"
            )

    @property
    def rate(self) -> float:
        """Runs per second."""
        return self.count / self.per

    @property
    def bucket(self) -> int:
        """How many runs may begin at once after a quiet while."""
        return self.burst if self.burst is not None else max(1, math.floor(self.rate))

    def __str__(self) -> str:
        return f"{self.count:g} per {self.per:g} s (burst {self.bucket})"

    @classmethod
    def of(cls, value: Any) -> RateLimit:
        """`value` as a rate limit: one already, or text such as "100/s", "5000/h", "10/min"."""
        if isinstance(value, RateLimit):
            return value
        match = _TEXT.match(value) if isinstance(value, str) else None
        if match is None or match.group(2) not in _PERIODS:
            raise TypeRegistryError(
                f"a rate limit reads like '100/s', '10/min', '5000/h' or '1000/d', not {value!r}"
            )
        return cls(float(match.group(1)), _PERIODS[match.group(2)])
