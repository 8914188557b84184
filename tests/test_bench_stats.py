"""The fan-out benchmark reads the hosts' write counters once the finished job let go: a
controller counts the writes of released activations only (in process, no Ray)."""

from __future__ import annotations

from typing import Any

import pytest

from choreography_ray import bench


def _stats(live: int, rows: int) -> dict[str, dict[str, Any]]:
    return {"controller": {"live_jobs": live, "step_rows": rows}, "worker": {"step_rows": rows}}


class _Clock:
    """Time that moves 1 s with each reading of the hosts' statistics; polls never sleep."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        pass


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


@pytest.fixture
def readings(monkeypatch: pytest.MonkeyPatch, clock: _Clock) -> list[dict[str, dict[str, Any]]]:
    """What successive `host_stats` calls return (the last one again once the rest are read)."""
    queue: list[dict[str, dict[str, Any]]] = []

    def host_stats(namespace: str) -> dict[str, dict[str, Any]]:
        clock.now += 1.0
        return queue.pop(0) if len(queue) > 1 else queue[0]

    monkeypatch.setattr(bench, "host_stats", host_stats)
    return queue


def test_the_counters_are_read_once_the_job_released(readings: list[Any], clock: _Clock) -> None:
    readings.extend([_stats(live=1, rows=0), _stats(live=1, rows=0), _stats(live=0, rows=7)])
    after = bench._released("ns", _stats(live=0, rows=0), clock, clock.sleep)
    assert after["controller"]["step_rows"] == 7


def test_a_job_never_released_is_waited_for_a_bounded_time(
    readings: list[Any], clock: _Clock
) -> None:
    readings.append(_stats(live=1, rows=0))
    after = bench._released("ns", _stats(live=0, rows=0), clock, clock.sleep)
    assert after["controller"]["live_jobs"] == 1 and clock.now == 10.0


def test_a_driver_and_workers_importing_two_copies_of_the_package_are_named() -> None:
    assert (
        bench.code_mismatch("/a/choreography_ray/__init__.py", "/a/choreography_ray/__init__.py")
        is None
    )
    problem = bench.code_mismatch(
        "/old/choreography_ray/__init__.py", "/new/choreography_ray/__init__.py"
    )
    assert problem is not None
    assert "workers import choreography_ray from /new/choreography_ray/__init__.py" in problem
    assert "this driver from /old/choreography_ray/__init__.py" in problem
    assert (
        "Run the benchmark from the checkout whose code it measures, with PYTHONPATH=." in problem
    )


def test_one_copy_reached_through_a_link_is_the_same_code(tmp_path) -> None:
    real = tmp_path / "checkout" / "choreography_ray"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "checkout")
    linked = tmp_path / "link" / "choreography_ray" / "__init__.py"
    assert bench.code_mismatch(str(real / "__init__.py"), str(linked)) is None
