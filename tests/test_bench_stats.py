"""The fan-out benchmark reads the hosts' write counters once the finished job let go: a
controller counts the writes of released activations only (in process, no Ray)."""

from __future__ import annotations

from typing import Any

import pytest

from choreography_ray import bench


def _stats(live: int, rows: int) -> dict[str, dict[str, Any]]:
    return {"controller": {"live_jobs": live, "step_rows": rows}, "worker": {"step_rows": rows}}


@pytest.fixture
def readings(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, dict[str, Any]]]:
    """What successive `host_stats` calls return; polls do not sleep, time moves 1 s a read."""
    queue: list[dict[str, dict[str, Any]]] = []
    clock = [0.0]

    def host_stats(namespace: str) -> dict[str, dict[str, Any]]:
        clock[0] += 1.0
        return queue.pop(0) if len(queue) > 1 else queue[0]

    monkeypatch.setattr(bench, "host_stats", host_stats)
    monkeypatch.setattr(bench.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(bench.time, "monotonic", lambda: clock[0])
    return queue


def test_the_counters_are_read_once_the_job_released(readings: list[Any]) -> None:
    readings.extend([_stats(live=1, rows=0), _stats(live=1, rows=0), _stats(live=0, rows=7)])
    assert bench._released("ns", _stats(live=0, rows=0))["controller"]["step_rows"] == 7


def test_a_job_never_released_is_waited_for_a_bounded_time(readings: list[Any]) -> None:
    readings.append(_stats(live=1, rows=0))
    assert bench._released("ns", _stats(live=0, rows=0))["controller"]["live_jobs"] == 1
