"""The client's async core and its blocking wrapper, without Ray: the async client awaits the
host's answer on the caller's loop (no thread per call), and the blocking client runs every
call on one loop of its own, also from a thread whose loop is running (a notebook)."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from choreography_ray.jobs import JobStatus
from choreography_ray.jobs.state import JobState
from choreography_ray.runtime import client
from choreography_ray.runtime.async_client import AsyncJobs
from choreography_ray.runtime.client import Jobs
from choreography_ray.runtime.operations import Get, ListJobs, Operation, Stop, Wait


def _state(status: JobStatus) -> JobState:
    return JobState(id="j", type="t", created=datetime.now(UTC), status=status)


class Controller:
    """A controller host's handle: `perform.remote(request)` answers an awaitable, as a Ray
    object reference is, settled on the caller's loop."""

    def __init__(self) -> None:
        self.performed: list[Operation[Any]] = []
        self.threads: list[threading.Thread] = []
        self.perform = self
        self.states = iter([_state(JobStatus.RUNNING), _state(JobStatus.COMPLETED_SUCCESSFULLY)])
        self.gets = [JobStatus.RUNNING, JobStatus.RUNNING, JobStatus.COMPLETED_SUCCESSFULLY]

    def remote(self, operation: Operation[Any]) -> asyncio.Future[Any]:
        self.performed.append(operation)
        self.threads.append(threading.current_thread())
        answer: Any = None
        if isinstance(operation, Get):
            answer = _state(self.gets.pop(0) if self.gets else JobStatus.RUNNING)
        elif isinstance(operation, Wait):
            answer = next(self.states)
        elif isinstance(operation, ListJobs):
            answer = []
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, answer)
        return future


class Routing:
    def __init__(self) -> None:
        self.handle = Controller()

    def controller(self) -> Controller:
        return self.handle

    def forget(self) -> None:
        raise AssertionError("the host was not gone")


def _offline(jobs: AsyncJobs) -> Controller:
    routing = Routing()
    jobs._routing = routing  # type: ignore[assignment]
    return routing.handle


@pytest.fixture
def no_threads(monkeypatch):
    """Every way to hand a call to another thread fails the test."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the async client handed a call to a thread")

    monkeypatch.setattr(asyncio, "to_thread", refused)
    monkeypatch.setattr(asyncio.BaseEventLoop, "run_in_executor", refused)
    monkeypatch.setattr(threading.Thread, "start", refused)


def test_the_async_client_awaits_the_hosts_answer_on_the_callers_loop(no_threads):
    jobs = AsyncJobs("offline")
    host = _offline(jobs)

    async def calls() -> tuple[Any, ...]:
        state = await jobs.get("j")
        await jobs.stop("j")
        listed = await jobs.list()
        seen = [s.status async for s in jobs.events("j", interval=0)]
        return state, listed, seen

    before = threading.active_count()
    state, listed, seen = asyncio.run(calls())
    assert threading.active_count() == before
    assert state.status == JobStatus.RUNNING and listed == []
    assert seen == [JobStatus.RUNNING, JobStatus.COMPLETED_SUCCESSFULLY]
    assert [type(op) for op in host.performed][:3] == [Get, Stop, ListJobs]
    assert {id(thread) for thread in host.threads} == {id(threading.main_thread())}


def test_the_async_wait_is_held_by_the_host_not_a_thread(no_threads):
    jobs = AsyncJobs("offline")
    host = _offline(jobs)
    state = asyncio.run(jobs.wait("j", timeout=30))
    assert state is not None and state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert [type(op) for op in host.performed] == [Wait, Wait]


def test_the_blocking_client_runs_every_call_on_one_background_loop():
    jobs = Jobs("offline")
    host = _offline(jobs.aio)
    jobs.get("j")
    threads = threading.active_count()
    for _ in range(20):
        jobs.get("j")
        jobs.stop("j")
    assert threading.active_count() == threads
    assert len(host.performed) == 41
    assert len({id(thread) for thread in host.threads}) == 1  # one loop's thread, not one per call
    assert jobs.wait("j", timeout=30).status == JobStatus.COMPLETED_SUCCESSFULLY


def test_the_blocking_client_works_where_a_loop_already_runs():
    """As in a notebook cell, or an async driver calling the blocking client."""
    jobs = Jobs("offline")
    _offline(jobs.aio)

    async def cell() -> JobState:
        return jobs.get("j")

    assert asyncio.run(cell()).status == JobStatus.RUNNING


def test_a_blocking_call_from_the_clients_own_loop_says_to_await_instead():
    jobs = Jobs("offline")
    _offline(jobs.aio)

    async def on_the_clients_loop() -> None:
        jobs.get("j")

    with pytest.raises(RuntimeError, match=r"await the same call on `jobs\.aio`"):
        client._run(on_the_clients_loop())


def test_the_blocking_events_close_the_async_iteration_when_left_early():
    jobs = Jobs("offline")
    _offline(jobs.aio)
    closed: list[bool] = []
    events = jobs.aio.events

    async def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            async for state in events(*args, **kwargs):
                yield state
        finally:
            closed.append(True)

    jobs.aio.events = watched  # type: ignore[method-assign]
    for state in jobs.events("j", interval=0):
        assert state.status == JobStatus.RUNNING
        break
    assert closed == [True]
