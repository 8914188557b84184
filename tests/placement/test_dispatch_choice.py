"""The Ray dispatcher asks placement which worker hosts may take a job's steps, before it
prepares them (`check_placement`) and as it sends them; here over a stub routing table."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from choreography_ray.engine.messages import StepStart
from choreography_ray.jobs import NoEligibleJobWorker
from choreography_ray.jobs.state import JobKey
from choreography_ray.placement.capability import HostAdvert
from choreography_ray.runtime.dispatch import RayDispatcher


class StubRoutes:
    def __init__(self, workers: list[str]) -> None:
        self.workers = workers
        self.calls: list[tuple[str, str]] = []

    async def refresh(self) -> None:
        return None

    async def call(self, name: str, method: str, *args: Any) -> list[Any]:
        self.calls.append((name, method))
        return []


ADVERTS = {
    "w1": HostAdvert(name="w1", node_id="n1", job_types=["geo.Index"]),
    "w2": HostAdvert(name="w2", node_id="n2", failed_modules={"geo": "ImportError: gdal"}),
}


def dispatcher(workers: list[str]) -> tuple[RayDispatcher, StubRoutes]:
    routes = StubRoutes(workers)

    async def adverts(hosts: list[str]) -> dict[str, HostAdvert]:
        return {name: ADVERTS[name] for name in hosts if name in ADVERTS}

    return RayDispatcher(routes, "controller", adverts), routes  # type: ignore[arg-type]


def test_steps_are_sent_only_to_worker_hosts_that_run_the_job_type() -> None:
    sender, routes = dispatcher(["w1", "w2"])
    starts = [StepStart(f"s{n}", 0) for n in range(4)]
    # A step that ran on a host that cannot run its type any more is not sent back there.
    asyncio.run(sender.start_steps(JobKey(), "j", "geo.Index", starts, {"s0": "w2"}))
    assert routes.calls == [("w1", "start_steps")]


@pytest.mark.parametrize(
    ("workers", "message"),
    [
        ([], "no worker host is running in this cluster"),
        (["w2"], "no worker host can run job type 'geo.Index': node n2 (w2): module geo"),
    ],
)
def test_check_placement_says_why_no_worker_qualifies(workers, message) -> None:
    sender, _ = dispatcher(workers)
    with pytest.raises(NoEligibleJobWorker, match=message.replace("(", r"\(").replace(")", r"\)")):
        asyncio.run(sender.check_placement(JobKey(), "geo.Index"))
    asyncio.run(dispatcher(["w1"])[0].check_placement(JobKey(), "geo.Index"))
