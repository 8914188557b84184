"""Blocking calls on a provider's threads: when the threads count as idle."""

from __future__ import annotations

import threading

from choreography_ray.storage.blocking import BlockingCalls


def _calls(due: bool, released: threading.Event, ran: list[str]) -> BlockingCalls:
    def housekeeping() -> None:
        ran.append("housekeeping")
        released.wait(timeout=30)

    return BlockingCalls(1, "test", housekeeping, lambda: due)


def test_the_threads_are_idle_when_a_caller_hears_the_outcome_and_no_housekeeping_is_due(run):
    # SQLite's inline writes go ahead only while the thread is idle: right after a call
    # answered, the next write must find it so, not wait for the thread's bookkeeping.
    released, ran = threading.Event(), []
    calls = _calls(False, released, ran)

    async def scenario() -> bool:
        assert await calls.submit(lambda: "done") == "done"
        return calls.idle

    try:
        assert run(scenario()) is True
        assert ran == []
    finally:
        released.set()
        calls.shutdown()


def test_housekeeping_due_after_a_call_keeps_the_threads_busy_until_it_is_done(run):
    released, ran = threading.Event(), []
    calls = _calls(True, released, ran)

    async def scenario() -> bool:
        assert await calls.submit(lambda: "done") == "done"  # answered before housekeeping
        return calls.idle

    try:
        assert run(scenario()) is False
    finally:
        released.set()
        calls.shutdown()
    assert ran == ["housekeeping"]
    assert calls.idle
