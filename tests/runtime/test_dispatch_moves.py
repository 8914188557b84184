"""Which worker hosts the Ray dispatcher asks to hand back queued runs (no Ray: the routing
table is a stand-in)."""

from __future__ import annotations

import asyncio

from choreography_ray.engine.messages import SettledStops, StepReport, StopRequest, StopResult
from choreography_ray.jobs import JobKey, JobStepStatus
from choreography_ray.runtime.dispatch import RayDispatcher

from .host_stubs import TableStub


class Routes(TableStub):
    """`w1` takes new work; `w2` is on a node Ray drains; `w3` left the table."""

    workers = ["w1"]
    draining = ["w2"]

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def answer(self, name: str, method: str, args: tuple[object, ...]) -> object:
        assert method == "give_up_queued"
        self.asked.append(name)
        return [f"{name}-queued"]


def test_a_draining_host_is_asked_for_its_queued_runs():
    """A draining host takes no new work, so it has left `workers`; its queued runs are
    exactly what must move, so it is asked all the same (it was not: a drained node went
    on starting every run queued there, 250 of them in a test on Ray)."""
    routes = Routes()
    dispatcher = RayDispatcher(routes, controller="c")  # type: ignore[arg-type]
    given = asyncio.run(dispatcher.give_up(JobKey(), "job", {"w2": 1.0}))
    assert routes.asked == ["w2"]
    assert given == ["w2-queued"]


def test_a_host_that_left_the_table_is_not_asked():
    routes = Routes()
    dispatcher = RayDispatcher(routes, controller="c")  # type: ignore[arg-type]
    given = asyncio.run(dispatcher.give_up(JobKey(), "job", {"w1": 0.5, "w3": 1.0}))
    assert routes.asked == ["w1"]
    assert given == ["w1-queued"]


class Holding(TableStub):
    """`w1` takes new work; `w2`, on a node Ray drains, runs step `b`."""

    workers = ["w1"]
    draining = ["w2"]

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def answer(self, name: str, method: str, args: tuple[object, ...]) -> object:
        self.asked.append((name, method))
        runs = {"w1": ["a"], "w2": ["b"]}[name]
        if method == "held_steps":
            return runs
        if method == "running_steps":
            return "epoch", runs
        if method == "stop_steps":
            return StopResult(stopping=runs)
        if method == "stop_and_wait":
            return SettledStops(settled=[StepReport(s, JobStepStatus.STOPPED, 1, 1) for s in runs])
        raise AssertionError(method)


STOP = StopRequest(JobKey(), "job", generation=1, step_ids=("a", "b"))


def test_the_runs_of_a_draining_host_are_located():
    """A new activation pins each run to the host that holds it; a run on a draining host
    not found there would be sent elsewhere and run twice."""
    dispatcher = RayDispatcher(Holding(), controller="c")  # type: ignore[arg-type]
    assert asyncio.run(dispatcher.locate(JobKey(), "job")) == {"a": "w1", "b": "w2"}
    lost = asyncio.run(dispatcher.unheld(JobKey(), "job", {"w1": ["a"], "w2": ["b", "c"]}))
    assert lost == ["c"]


def test_a_stop_reaches_the_runs_of_a_draining_host():
    """Not told, the draining host's run went on while the stop counted it as not running."""
    dispatcher = RayDispatcher(Holding(), controller="c")  # type: ignore[arg-type]
    answer = asyncio.run(dispatcher.stop_steps(STOP))
    assert sorted(answer.stopping) == ["a", "b"] and answer.not_running == []
    settled = asyncio.run(dispatcher.stop_and_wait(STOP, 5.0))
    assert sorted(r.step_id for r in settled.settled) == ["a", "b"]
