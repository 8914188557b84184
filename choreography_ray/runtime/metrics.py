"""Metrics through `ray.util.metrics`, so the Ray dashboard and Prometheus see them."""

from __future__ import annotations

import logging
import time

from ..engine.run_host import StepMetrics
from ..jobs.status import JobStatus, JobStepStatus

log = logging.getLogger("choreography_ray.runtime")

_EVENTS = {
    JobStepStatus.COMPLETED_SUCCESSFULLY: "succeeded",
    JobStepStatus.COMPLETED_WITH_FAILURE: "failed",
    JobStepStatus.STOPPED: "stopped",
    JobStepStatus.REMOVING: "stopped",
}

_OBSERVED_PER_SECOND = 200
"""Step durations a host gives the histogram per second, at most: a sample, not every step."""
_DURATION_BOUNDARIES = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 1800]


class Metrics(StepMetrics):
    """Counters and a histogram of one host; a no-op where Ray's metrics are unavailable. A
    worker host's worker counts its steps here."""

    def __init__(self, role: str) -> None:
        self.role = role
        try:
            from ray.util.metrics import Counter, Histogram

            self._jobs = Counter(
                "choreography_job_status_changes",
                description="Jobs entering each status.",
                tag_keys=("status",),
            )
            self._starts = Counter(
                "choreography_job_starts",
                description="Job starts by job type and whether they succeeded.",
                tag_keys=("job_type", "succeeded"),
            )
            self._steps = Counter(
                "choreography_steps",
                description="Steps started, succeeded, failed and stopped.",
                tag_keys=("event",),
            )
            self._duration = Histogram(
                "choreography_step_duration_seconds",
                description="Time from a step's start to its persisted outcome.",
                boundaries=_DURATION_BOUNDARIES,
            )
            self.enabled = True
            self._pending: dict[str, int] = {}
            self._observed = 0
            self._flushed = time.monotonic()
        except Exception as error:  # outside a Ray worker, or metrics disabled
            log.debug("metrics disabled: %s", error)
            self.enabled = False

    def job_status(self, status: JobStatus) -> None:
        if self.enabled:
            self._jobs.inc(tags={"status": status.name})

    def job_started(self, job_type: str, succeeded: bool) -> None:
        if self.enabled:
            self._starts.inc(tags={"job_type": job_type, "succeeded": str(succeeded).lower()})

    def step_started(self) -> None:
        self._count("started")

    def step_finished(self, status: JobStepStatus, seconds: float) -> None:
        if not self.enabled:
            return
        self._count(_EVENTS.get(status, status.name.lower()))
        if self._observed < _OBSERVED_PER_SECOND:
            # A sample: observing each of thousands of steps a second cost 3-4 % of a worker
            # host's CPU; `choreography_steps` keeps the exact counts.
            self._observed += 1
            self._duration.observe(seconds)

    def _count(self, event: str) -> None:
        """Counted locally and handed to Ray at most once a second: a step must not pay for a
        metrics call of its own."""
        if not self.enabled:
            return
        self._pending[event] = self._pending.get(event, 0) + 1
        now = time.monotonic()
        if now - self._flushed >= 1.0:
            self.flush(now)
            self._observed = 0

    def flush(self, now: float | None = None) -> None:
        if not self.enabled or not self._pending:
            return
        pending, self._pending = self._pending, {}
        self._flushed = time.monotonic() if now is None else now
        for event, count in pending.items():
            self._steps.inc(count, tags={"event": event})
