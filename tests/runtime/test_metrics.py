"""The hosts' Ray metrics: step counts exact, handed to Ray at most once a second; the
duration histogram a bounded sample, so that no step pays for a metrics call of its own."""

from __future__ import annotations

from typing import Any

import pytest

from choreography_ray.jobs import JobStepStatus
from choreography_ray.runtime import metrics as metrics_module


class Recorded:
    def __init__(self) -> None:
        self.incs: list[tuple[int, dict[str, str]]] = []
        self.observed: list[float] = []

    def inc(self, value: int = 1, tags: dict[str, str] | None = None) -> None:
        self.incs.append((value, tags or {}))

    def observe(self, value: float) -> None:
        self.observed.append(value)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(metrics_module.time, "monotonic", lambda: now[0])
    return now


def _metrics() -> tuple[Any, Recorded, Recorded]:
    metrics = metrics_module.Metrics("worker")
    steps, duration = Recorded(), Recorded()
    metrics.enabled = True
    metrics._steps, metrics._duration = steps, duration
    metrics._pending, metrics._observed, metrics._flushed = {}, 0, 1000.0
    return metrics, steps, duration


def test_step_counts_are_exact_and_durations_a_sample_of_at_most_200_a_second(clock):
    metrics, steps, duration = _metrics()
    for _ in range(1000):
        metrics.step_finished(JobStepStatus.COMPLETED_SUCCESSFULLY, 0.01)
    assert len(duration.observed) == 200
    assert steps.incs == []  # handed to Ray at most once a second
    clock[0] += 1.0
    metrics.step_finished(JobStepStatus.COMPLETED_SUCCESSFULLY, 0.01)
    assert steps.incs == [(1001, {"event": "succeeded"})]
    for _ in range(300):  # a new second: a new sample
        metrics.step_finished(JobStepStatus.COMPLETED_WITH_FAILURE, 0.02)
    assert len(duration.observed) == 400
