"""Adaptive concurrency (opt-in per step class): a job's window of active steps follows what
the service behind its steps can take, additive increase and multiplicative decrease.

    class CallPartnerApi(JobStep[Call, Call, Answer], name="partner-api"):
        adaptive = AdaptiveConcurrency(limit=256, floor=4, latency=2.0)

A throttled failure (`StepFailed(..., throttled=True)`, or an error of a type named in
`throttle_errors`) or an outcome slower than `latency` seconds halves the window (once per
window's worth of steps); each window's worth of successes grows it by one; it stays between
`floor` and `limit`. How the window is kept is the engine's (`engine.adaptive`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .errors import TypeRegistryError
from .retry import error_type_name
from .state import JobState, WindowState


@dataclass(frozen=True)
class AdaptiveConcurrency:
    limit: int
    """The largest window, and the first."""
    floor: int = 1
    latency: float | None = None
    """Seconds from a step's dispatch to its outcome above which it counts as throttled;
    None: latency does not count."""
    throttle_errors: tuple[str, ...] = field(default=())
    """Error types (classes or `module.QualName` names) that count as throttled."""

    def __init__(
        self,
        limit: int,
        floor: int = 1,
        latency: float | timedelta | None = None,
        throttle_errors: tuple[type[BaseException] | str, ...] = (),
    ) -> None:
        for name, value in (("limit", limit), ("floor", floor)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TypeRegistryError(f"adaptive concurrency's {name} is a whole number >= 1")
        if floor > limit:
            raise TypeRegistryError(f"adaptive concurrency's floor {floor} is above its limit")
        seconds = latency.total_seconds() if isinstance(latency, timedelta) else latency
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0
        ):
            raise TypeRegistryError(f"adaptive concurrency's latency must be positive: {latency!r}")
        if isinstance(throttle_errors, str | type):
            throttle_errors = (throttle_errors,)
        object.__setattr__(self, "limit", limit)
        object.__setattr__(self, "floor", floor)
        object.__setattr__(self, "latency", None if seconds is None else float(seconds))
        object.__setattr__(
            self, "throttle_errors", tuple(error_type_name(e) for e in throttle_errors)
        )

    def throttles(self, error: Any) -> bool:
        """Whether a step's failure (`StepError`) says the service throttles."""
        return error is not None and (
            bool(error.throttled) or error.error_type in self.throttle_errors
        )


def windows(job: JobState) -> dict[str, WindowState]:
    """A job's adaptive windows by step type. A record of an earlier version holds one window
    only (`adaptive_window`, its first adaptive step type's), shown under no name ("")."""
    if job.adaptive_windows or job.adaptive_window is None:
        return job.adaptive_windows
    return {"": job.adaptive_window}


def window_lines(job: JobState) -> list[str]:
    """`adaptive partner-api: window 37/256, throttled 12 times`, one line per window."""
    return [
        f"adaptive{' ' + name if name else ''}: {window.text()}"
        for name, window in windows(job).items()
    ]
