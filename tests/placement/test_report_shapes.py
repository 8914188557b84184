"""A worker host sends each controller host reports in the shape its release reads: a host
that advertises `step-decisions` gets a step's stored decision, one of the previous release
(or one that has not advertised) its `non_retryable` flag instead (docs/decisions.md)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from choreography_ray.engine.messages import (
    StartOutcome,
    StartResult,
    StepReport,
    pack_reports,
    unpack_reports,
)
from choreography_ray.jobs.state import JobKey, StepDecision, StepError
from choreography_ray.jobs.status import JobStepStatus
from choreography_ray.placement.capability import STEP_DECISIONS, HostAdvert
from choreography_ray.runtime.dispatch import RayReporter
from choreography_ray.runtime.worker_host import WorkerHost

from ..runtime.host_stubs import TableStub

KEY = JobKey()
RETRY = StepReport(
    "s",
    JobStepStatus.COMPLETED_WITH_FAILURE,
    1,
    2,
    error=StepError(messages=["no"]),
    decision=StepDecision(attempt=2, retry=True, retry_at=datetime(2026, 1, 1, tzinfo=UTC)),
)
ADVERTS = {
    "new": HostAdvert(name="new", node_id="n1", capabilities=[STEP_DECISIONS]),
    "old": HostAdvert(name="old", node_id="n2"),
}


class StubRoutes(TableStub):
    def __init__(self, controllers: list[str], dead: tuple[str, ...] = ()) -> None:
        self.controllers = controllers
        self.dead = dead
        self.delivered: dict[str, list[Any]] = {}

    async def answer(self, name: str, method: str, args: tuple[Any, ...]) -> None:
        assert method == "deliver"
        if name in self.dead:
            raise ConnectionError(f"{name} died")
        self.delivered[name] = args[-1]


def reporter(routes: StubRoutes) -> RayReporter:
    async def adverts(hosts: list[str]) -> dict[str, HostAdvert]:
        return {name: ADVERTS[name] for name in hosts if name in ADVERTS}

    return RayReporter(routes, adverts)  # type: ignore[arg-type]


def test_each_controller_host_gets_reports_in_its_release_s_shape() -> None:
    for name, last in [("new", RETRY.decision.model_dump_json()), ("old", False)]:  # type: ignore[union-attr]
        routes = StubRoutes([name])
        asyncio.run(reporter(routes).report(KEY, "j", [RETRY]))
        [packed] = routes.delivered[name]
        assert packed[-1] == last
    # A host that has not advertised is taken as the previous release.
    routes = StubRoutes(["silent"])
    asyncio.run(reporter(routes).report(KEY, "j", [RETRY]))
    assert routes.delivered["silent"] == pack_reports([RETRY], decisions=False)
    # Without advertisements (tests) every host is this release.
    routes = StubRoutes(["silent"])
    asyncio.run(RayReporter(routes).report(KEY, "j", [RETRY]))  # type: ignore[arg-type]
    assert unpack_reports(routes.delivered["silent"]) == [RETRY]


def test_the_shape_follows_the_host_that_takes_the_reports_over() -> None:
    """The job's controller died: the host that takes its reports over gets its own shape."""
    routes = StubRoutes(["new", "old"], dead=("new",))
    sender = reporter(routes)
    sender.controllers[(KEY, "j")] = "new"
    asyncio.run(sender.report(KEY, "j", [RETRY]))
    assert routes.delivered == {"old": pack_reports([RETRY], decisions=False)}


class StubWorker:
    async def start_steps(self, *args: Any) -> list[StartResult]:
        return [StartResult("s", StartOutcome.COMPLETED, report=RETRY)]


class StubWorkerHost:
    """What `WorkerHost.start_steps` uses of its host."""

    def __init__(self, routes: StubRoutes) -> None:
        self.reporter = reporter(routes)
        self.worker = StubWorker()

    async def ready(self) -> None:
        return None


def test_a_worker_host_answers_a_start_in_the_calling_controller_s_shape() -> None:
    """A stored outcome found by a start goes back as itself: to a controller host of the
    previous release with its `non_retryable` flag where the decision is."""
    answers = {}
    for caller in ("new", "old"):
        host = StubWorkerHost(StubRoutes(["new", "old"]))
        [answers[caller]] = asyncio.run(
            WorkerHost.start_steps(host, caller, KEY, "j", "t", [("s", 1, 2)])  # type: ignore[arg-type]
        )
    assert answers["new"].report is RETRY
    assert answers["old"].report[:-1] == RETRY[:-1] and answers["old"].report[-1] is False
    # A controller host that joined since the worker host last read its routing table is
    # still answered by its own advertisement.
    joined = StubWorkerHost(StubRoutes(["old"]))
    [answer] = asyncio.run(WorkerHost.start_steps(joined, "new", KEY, "j", "t", [("s", 1, 2)]))  # type: ignore[arg-type]
    assert answer.report is RETRY
