"""Which worker hosts the Ray dispatcher asks to hand back queued runs (no Ray: the routing
table is a stand-in)."""

from __future__ import annotations

import asyncio

from choreography_ray.jobs import JobKey
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
