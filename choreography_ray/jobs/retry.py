"""Retry schedules: the author's `RetryPolicy` for failed steps, and the `Backoff` every retry
loop of the package waits by.

One formula (`exponential`) gives every delay: a step's next attempt, a report or a stop
notification sent again, a recovery tried again, a storage call repeated after a transient
error. `RetryPolicy` is a frozen value, after Temporal's retry policy: how long the first wait
is, how it grows and up to what, how many attempts a step gets, and which errors no attempt
can fix. The most specific one wins whole: the error's `StepFailed(retry_after=...)` sets the
wait of that one retry, then the step class's `retry_policy`, the job class's, and last the
options (`max_step_attempts`, `step_retry_backoff`, `max_step_retry_backoff`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .errors import InvalidOptionError


def exponential(initial: float, coefficient: float, maximum: float, attempt: int) -> float:
    """Seconds to wait after the `attempt`-th failure (1 for the first): `initial`, times
    `coefficient` per later failure, never above `maximum`."""
    if attempt <= 1 or coefficient == 1:
        return min(initial, maximum)
    try:
        return min(maximum, initial * coefficient ** (attempt - 1))
    except OverflowError:
        return maximum


def duration_seconds(name: str, value: Any) -> float:
    """`value` (a `timedelta` or seconds) in seconds; refused naming `name` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float | timedelta):
        raise InvalidOptionError(name, f"expected a timedelta or seconds, got {value!r}")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidOptionError(name, f"must be a finite duration >= 0, got {value!r}")
    return seconds


def check_policy(owner: type) -> None:
    """A class's `retry_policy` is a `RetryPolicy` or None: a mistake there is refused when
    the class is defined, not found at its first failure."""
    policy = getattr(owner, "retry_policy", None)
    if policy is not None and not isinstance(policy, RetryPolicy):
        raise InvalidOptionError(
            f"{owner.__qualname__}.retry_policy",
            f"expected a RetryPolicy or None, got {policy!r}",
        )


def error_type_name(error: type[BaseException] | str) -> str:
    """How an error type is named in a policy and in a stored step error: `module.QualName`
    (a builtin is its bare name, `ValueError`)."""
    if isinstance(error, str):
        return error
    if error.__module__ == "builtins":
        return error.__qualname__
    return f"{error.__module__}.{error.__qualname__}"


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed step is tried again. Immutable; every field is checked when it is made.

        RetryPolicy(
            initial_interval=timedelta(seconds=2),  # the wait before the 2nd attempt
            backoff_coefficient=3.0,                # each later wait is 3 times the previous
            maximum_interval=timedelta(minutes=5),  # and never longer than this
            maximum_attempts=4,                     # the first attempt and 3 retries
            non_retryable_error_types=(PermissionError, "billing.CardDeclined"),
        )

    Durations are `timedelta`s or seconds. An error type is an exception class or its name
    (`module.QualName`, a builtin's bare name); it matches that exact type, as in Temporal.
    """

    initial_interval: timedelta = timedelta(seconds=1)
    backoff_coefficient: float = 2.0
    maximum_interval: timedelta = timedelta(seconds=60)
    maximum_attempts: int = 1
    """Attempts in all, the first included: 1 never retries."""
    non_retryable_error_types: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        initial = duration_seconds("RetryPolicy.initial_interval", self.initial_interval)
        maximum = duration_seconds("RetryPolicy.maximum_interval", self.maximum_interval)
        if maximum < initial:
            raise InvalidOptionError(
                "RetryPolicy.maximum_interval",
                f"must not be shorter than initial_interval ({initial:g} s), got {maximum:g} s",
            )
        coefficient = self.backoff_coefficient
        if (
            isinstance(coefficient, bool)
            or not isinstance(coefficient, int | float)
            or not math.isfinite(coefficient)
            or coefficient < 1
        ):
            raise InvalidOptionError(
                "RetryPolicy.backoff_coefficient", f"must be a number >= 1, got {coefficient!r}"
            )
        attempts = self.maximum_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise InvalidOptionError(
                "RetryPolicy.maximum_attempts", f"must be a whole number >= 1, got {attempts!r}"
            )
        types = self.non_retryable_error_types
        if isinstance(types, str | type) or not isinstance(types, Iterable):
            raise InvalidOptionError(
                "RetryPolicy.non_retryable_error_types",
                f"expected a tuple of exception classes or names, got {types!r}",
            )
        names = []
        for entry in types:
            if isinstance(entry, type) and issubclass(entry, BaseException):
                names.append(error_type_name(entry))
            elif isinstance(entry, str) and entry.strip():
                names.append(entry.strip())
            else:
                raise InvalidOptionError(
                    "RetryPolicy.non_retryable_error_types",
                    f"expected an exception class or its name, got {entry!r}",
                )
        object.__setattr__(self, "initial_interval", timedelta(seconds=initial))
        object.__setattr__(self, "maximum_interval", timedelta(seconds=maximum))
        object.__setattr__(self, "backoff_coefficient", float(coefficient))
        object.__setattr__(self, "non_retryable_error_types", tuple(names))

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt `attempt` before the next one."""
        return exponential(
            self.initial_interval.total_seconds(),
            self.backoff_coefficient,
            self.maximum_interval.total_seconds(),
            attempt,
        )

    def allows(self, attempt: int, error_type: str = "", *, non_retryable: bool = False) -> bool:
        """Whether failed attempt `attempt` may be tried again, by this policy alone (the
        job's `should_retry_step` has the last word)."""
        return (
            not non_retryable
            and attempt < self.maximum_attempts
            and not (error_type and error_type in self.non_retryable_error_types)
        )

    def backoff(self) -> Backoff:
        """A fresh schedule of this policy's waits, for a loop that retries until it works."""
        return Backoff(
            self.initial_interval.total_seconds(),
            self.maximum_interval.total_seconds(),
            self.backoff_coefficient,
        )


class Backoff:
    """The waits between the tries of one retry loop, growing from `initial` to `maximum`.

    A loop asks `next()` for how long to wait before its next try and calls `reset()` once a
    try succeeds."""

    __slots__ = ("_failures", "coefficient", "initial", "maximum")

    def __init__(self, initial: float, maximum: float, coefficient: float = 2.0) -> None:
        if initial < 0 or maximum < initial or coefficient < 1:
            raise ValueError(
                f"backoff: needs 0 <= initial <= maximum and coefficient >= 1, got "
                f"initial={initial}, maximum={maximum}, coefficient={coefficient}"
            )
        self.initial = initial
        self.maximum = maximum
        self.coefficient = coefficient
        self._failures = 0

    @classmethod
    def between(cls, initial: timedelta, maximum: timedelta) -> Backoff:
        return cls(initial.total_seconds(), max(initial, maximum).total_seconds())

    def next(self) -> float:
        """The wait before the next try, in seconds; the one after it is longer."""
        self._failures += 1
        return self.nth(self._failures)

    def peek(self) -> float:
        """The wait `next()` would answer, without moving on."""
        return self.nth(self._failures + 1)

    def nth(self, attempt: int) -> float:
        """The wait after the `attempt`-th failure in a row, whatever came before."""
        return exponential(self.initial, self.coefficient, self.maximum, attempt)

    def reset(self) -> None:
        """A try succeeded: the next failure waits `initial` again."""
        self._failures = 0
