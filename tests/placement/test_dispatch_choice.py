"""The Ray dispatcher asks placement which worker hosts may take a job's steps, before it
prepares them (`check_placement`) and as it sends them; here over a stub routing table."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from choreography_ray.engine.clock import FakeClock, settle
from choreography_ray.engine.messages import StepStart
from choreography_ray.engine.step_types import StepTypes
from choreography_ray.jobs import NoEligibleJobWorker
from choreography_ray.jobs.state import JobKey
from choreography_ray.placement.capability import HostAdvert
from choreography_ray.placement.spreading import LOAD_CADENCE
from choreography_ray.runtime.dispatch import RayDispatcher

from ..runtime.host_stubs import TableStub


class StubRoutes(TableStub):
    def __init__(self, workers: list[str]) -> None:
        self.workers = workers
        self.calls: list[tuple[str, str]] = []
        self.gone: list[Any] = []

    def on_gone(self, listener: Any) -> None:
        self.gone.append(listener)

    def leave(self, name: str) -> None:
        """The host leaves the table, as `Routes` tells its listeners."""
        self.workers = [n for n in self.workers if n != name]
        for listener in self.gone:
            listener(name)

    async def answer(self, name: str, method: str, args: tuple[Any, ...]) -> list[Any]:
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
    assert [call for call in routes.calls if call[1] != "load"] == [("w1", "start_steps")]


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


# -- each step by its own type, over the hosts by load ------------------------------------------

STEP_ADVERTS = {
    "w1": HostAdvert(
        name="w1", node_id="n1", job_types=["geo.Index"], step_types=["geo.tile", "geo.shape"]
    ),
    "w2": HostAdvert(
        name="w2",
        node_id="n2",
        job_types=["geo.Index"],
        step_types=["geo.shape"],
        failed_modules={"geo.tiles": "ModuleNotFoundError: No module named 'gdal'"},
    ),
}


class LoadedRoutes(StubRoutes):
    """Worker hosts that answer their load, and record which starts each took."""

    def __init__(self, workers: list[str], load: dict[str, tuple[int, int]]) -> None:
        super().__init__(workers)
        self.load = load
        self.took: dict[str, list[str]] = {}

    async def answer(self, name: str, method: str, args: tuple[Any, ...]) -> Any:
        self.calls.append((name, method))
        if method == "load":
            return self.load[name]
        if method == "start_steps":
            self.took.setdefault(name, []).extend(packed[0] for packed in args[-1])
        return []


def typed(**kinds: str) -> StepTypes:
    types = StepTypes()
    for step_id, kind in kinds.items():
        types.add(step_id, kind)
    return types


def step_dispatcher(
    routes: StubRoutes,
    adverts: dict[str, HostAdvert] = STEP_ADVERTS,
    clock: FakeClock | None = None,
) -> RayDispatcher:
    async def read(hosts: list[str]) -> dict[str, HostAdvert]:
        return {name: adverts[name] for name in hosts if name in adverts}

    return RayDispatcher(routes, "controller", read, clock=clock)  # type: ignore[arg-type]


def test_each_step_goes_only_to_a_worker_host_that_runs_its_own_type() -> None:
    routes = LoadedRoutes(["w1", "w2"], {"w1": (0, 2), "w2": (0, 2)})
    kinds = typed(s0="geo.shape", s1="geo.tile", s2="geo.shape", s3="geo.tile")
    answer = asyncio.run(
        step_dispatcher(routes).start_steps(
            JobKey(), "j", "geo.Index", [StepStart(f"s{n}", 0) for n in range(4)], {}, kinds
        )
    )
    assert set(routes.took["w1"]) >= {"s1", "s3"} and not {"s1", "s3"} & set(routes.took["w2"])
    assert answer.undelivered == [] and answer.error is None


def test_steps_of_a_type_no_worker_runs_are_undelivered_with_the_reason() -> None:
    routes = LoadedRoutes(["w2"], {"w2": (0, 2)})
    kinds = typed(s0="geo.shape", s1="geo.tile")
    answer = asyncio.run(
        step_dispatcher(routes).start_steps(
            JobKey(), "j", "geo.Index", [StepStart("s0", 0), StepStart("s1", 0)], {}, kinds
        )
    )
    assert routes.took == {"w2": ["s0"]}
    assert [s.step_id for s in answer.undelivered] == ["s1"]
    assert isinstance(answer.error, NoEligibleJobWorker)
    assert str(answer.error) == (
        "no worker host runs step type 'geo.tile' of job type 'geo.Index': node n2 (w2): "
        "module geo.tiles: ModuleNotFoundError: No module named 'gdal'"
    )
    # Before preparing, the same reason fails the check (the reference system's moment 1).
    with pytest.raises(NoEligibleJobWorker, match=r"step type 'geo\.tile'"):
        asyncio.run(
            step_dispatcher(routes).check_placement(
                JobKey(), "geo.Index", ["geo.shape", "geo.tile"]
            )
        )
    asyncio.run(step_dispatcher(routes).check_placement(JobKey(), "geo.Index", ["geo.shape"]))


def test_the_dispatcher_asks_the_loads_in_the_background_at_most_once_a_second() -> None:
    async def scenario() -> tuple[dict[str, list[str]], list[int]]:
        clock = FakeClock()
        routes = LoadedRoutes(["w1", "w2"], {"w1": (12, 2), "w2": (0, 2)})
        sender = step_dispatcher(routes, clock=clock)

        def questions() -> int:
            return sum(1 for _, method in routes.calls if method == "load")

        counts = []
        await sender.start_steps(JobKey(), "j", "geo.Index", [StepStart("a", 0)], {})
        await settle()  # the question, sent beside the batch, is answered
        counts.append(questions())
        routes.took.clear()
        for n in range(10):
            await sender.start_steps(JobKey(), "j", "geo.Index", [StepStart(f"b{n}", 0)], {})
        counts.append(questions())
        await clock.advance(LOAD_CADENCE)
        await sender.start_steps(JobKey(), "j", "geo.Index", [StepStart("c", 0)], {})
        counts.append(questions())
        return routes.took, counts

    took, counts = asyncio.run(scenario())
    assert counts == [2, 2, 4]  # both hosts once, then once more a cadence later
    assert took["w2"][:10] == [f"b{n}" for n in range(10)]  # w1 answered it is loaded


def test_with_one_worker_host_no_load_is_asked() -> None:
    routes = LoadedRoutes(["w1"], {"w1": (0, 2)})
    sender = step_dispatcher(routes)
    for n in range(5):
        asyncio.run(sender.start_steps(JobKey(), "j", "geo.Index", [StepStart(f"s{n}", 0)], {}))
    assert [method for _, method in routes.calls] == ["start_steps"] * 5


def test_a_batch_sent_beside_the_question_counts_even_when_the_answer_came_first() -> None:
    async def scenario() -> dict[str, list[str]]:
        routes = LoadedRoutes(["w1", "w2"], {"w1": (0, 2), "w2": (0, 2)})  # answered as asked
        sender = step_dispatcher(routes)
        four = [StepStart(f"a{n}", 0) for n in range(4)]
        await sender.start_steps(JobKey(), "j", "geo.Index", four, dict.fromkeys(sticky, "w1"))
        await settle()
        routes.took.clear()
        await sender.start_steps(
            JobKey(), "j", "geo.Index", [StepStart(f"b{n}", 0) for n in range(4)], {}
        )
        return routes.took

    sticky = [f"a{n}" for n in range(4)]
    assert asyncio.run(scenario()) == {"w2": ["b0", "b1", "b2", "b3"]}


def test_a_host_back_under_its_name_after_leaving_the_table_counts_as_empty() -> None:
    """A killed worker host restarted on its node keeps its name. What the dispatcher knew of
    the dead process (its last answer, every start sent to it since) must not make the new one
    look loaded: the next job's steps would all go to the other hosts."""

    async def scenario() -> dict[str, list[str]]:
        routes = LoadedRoutes(["w1", "w2"], {"w1": (0, 2), "w2": (40, 2)})
        sender = step_dispatcher(routes)
        await sender.start_steps(JobKey(), "j", "geo.Index", [StepStart("a", 0)], {})
        await settle()  # w2 answered it holds 40 runs
        routes.leave("w2")  # killed: its calls fail, it leaves the table
        routes.workers = ["w1", "w2"]  # started again on its node, under the same name
        routes.took.clear()
        batch = [StepStart(f"b{n}", 0) for n in range(8)]
        await sender.start_steps(JobKey(), "j", "geo.Index", batch, {})
        return routes.took

    took = asyncio.run(scenario())
    # w1 still holds "a" as far as the dispatcher knows: the empty w2 takes the extra step.
    assert {name: len(steps) for name, steps in took.items()} == {"w1": 3, "w2": 5}


@pytest.mark.parametrize(
    ("step_type", "took"),
    [
        ("choreography.bench.noop", {"w2": 10}),  # async, to the host without the first step
        ("choreography.bench.map-spin", {"w1": 4, "w2": 6}),  # synchronous: a CPU each
        ("no.such.step", {"w1": 4, "w2": 6}),  # not known here: taken as synchronous
    ],
)
def test_a_small_batch_goes_to_one_worker_host_only_when_its_steps_are_async(
    step_type: str, took: dict[str, int]
) -> None:
    import choreography_ray.bench  # noqa: F401  (registers the benchmark's step types)

    async def scenario() -> dict[str, list[str]]:
        clock = FakeClock()
        routes = LoadedRoutes(["w1", "w2"], {"w1": (0, 128), "w2": (0, 128)})
        adverts = {
            name: HostAdvert(
                name=name, node_id=f"n{name}", job_types=["geo.Index"], step_types=[step_type]
            )
            for name in ("w1", "w2")
        }
        sender = step_dispatcher(routes, adverts, clock)
        await sender.start_steps(JobKey(), "j", "geo.Index", [StepStart("a", 0)], {})
        await settle()  # the hosts answered their loads: 128 steps at once each
        routes.took.clear()
        kinds = typed(**{f"s{n}": step_type for n in range(10)})
        await sender.start_steps(
            JobKey(), "j", "geo.Index", [StepStart(f"s{n}", 0) for n in range(10)], {}, kinds
        )
        return routes.took

    assert {name: len(ids) for name, ids in asyncio.run(scenario()).items()} == took
