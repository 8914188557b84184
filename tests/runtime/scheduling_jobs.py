"""Jobs for the scheduling tests on Ray, imported by the hosts by name: each step records
when it began in a file of its own (a side-effect table outside storage), then works a while."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from choreography_ray.jobs import (
    AdaptiveConcurrency,
    ConcurrencyKey,
    Job,
    JobStep,
    RetryPolicy,
    StepContext,
    StepFailed,
)


class Timed(BaseModel):
    directory: str
    tag: str
    steps: int = 1
    seconds: float = 0.05
    n: int = 0


class RecordStart(JobStep[Timed, Timed, int], name="scheduling-tests.record-start"):
    def initialize_state(self, request: Timed) -> Timed:
        return request

    async def perform(self, state: Timed, ctx: StepContext) -> int:
        (Path(state.directory) / f"{state.tag}-{state.n}").write_text(repr(time.time()))
        await asyncio.sleep(state.seconds)
        return state.n


class TimedJob(Job[Timed], name="scheduling-tests.timed"):
    keep_after_completed = True

    def prepare_steps(self, request: Timed):
        return [
            self.create_step(RecordStart, request.model_copy(update={"n": n}))
            for n in range(request.steps)
        ]


def starts(directory: Path) -> list[str]:
    """The tag of every step that began, in the order they began."""
    found = [(float(path.read_text()), path.name.rsplit("-", 1)[0]) for path in directory.iterdir()]
    return [tag for _, tag in sorted(found)]


GATE = "scheduling-tests-gate"
GATE_NAMESPACE = "scheduling-tests"


class Gate:
    """A named actor keyed steps wait on, so the test decides when they finish."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def wait(self) -> None:
        await self.opened.wait()

    async def open(self) -> None:
        self.opened.set()


class Tenant(BaseModel):
    directory: str
    tenant: str
    tag: str


class WaitForGate(JobStep[Tenant, Tenant, int], name="scheduling-tests.wait-for-gate"):
    def initialize_state(self, request: Tenant) -> Tenant:
        return request

    async def perform(self, state: Tenant, ctx: StepContext) -> int:
        import ray

        (Path(state.directory) / f"{state.tag}-start").write_text(repr(time.time()))
        await ray.get_actor(GATE, namespace=GATE_NAMESPACE).wait.remote()
        (Path(state.directory) / f"{state.tag}-end").write_text(repr(time.time()))
        return 1


class KeyedJob(Job[Tenant], name="scheduling-tests.keyed"):
    keep_after_completed = True
    concurrency = ConcurrencyKey("tenant", max_running=2)

    def prepare_steps(self, request: Tenant):
        return [self.create_step(WaitForGate, request)]


class Keyed(BaseModel):
    directory: str
    tenant: str = "acme"
    n: int = 0


class KeyedCall(JobStep[Keyed, Keyed, int], name="scheduling-tests.keyed-call"):
    """One run of a tenant at a time, across the cluster: it notes when it performed, where."""

    concurrency = ConcurrencyKey("tenant", max_running=1)

    def initialize_state(self, request: Keyed) -> Keyed:
        return request

    async def perform(self, state: Keyed, ctx: StepContext) -> int:
        import ray

        began = time.time()
        await asyncio.sleep(0.3)
        node = ray.get_runtime_context().get_node_id()
        (Path(state.directory) / f"{state.tenant}-{state.n}").write_text(
            f"{began!r} {time.time()!r} {node}"
        )
        return state.n


class KeyedCallsJob(Job[Keyed], name="scheduling-tests.keyed-calls"):
    keep_after_completed = True

    def prepare_steps(self, request: Keyed):
        calls = [Keyed(directory=request.directory, n=n) for n in range(4)]
        calls += [Keyed(directory=request.directory, tenant="globex", n=n) for n in range(2)]
        return [self.create_step(KeyedCall, call) for call in calls]


def performed(directory: Path, tenant: str) -> list[tuple[float, float, str]]:
    """When each keyed call of `tenant` began and ended, and on which node, in order."""
    found = [p.read_text().split() for p in directory.iterdir() if p.name.startswith(tenant)]
    return sorted((float(began), float(ended), node) for began, ended, node in found)


RATE = 10.0
"""Runs a second the rate-limited step type allows, across the cluster."""


class Numbered(BaseModel):
    directory: str
    steps: int = 1
    n: int = 0


class RatedCall(JobStep[Numbered, Numbered, int], name="scheduling-tests.rated-call"):
    rate_limit = f"{RATE:g}/s"

    def initialize_state(self, request: Numbered) -> Numbered:
        return request

    async def perform(self, state: Numbered, ctx: StepContext) -> int:
        import ray

        node = ray.get_runtime_context().get_node_id()
        (Path(state.directory) / str(state.n)).write_text(f"{time.time()!r} {node}")
        return state.n


class RatedJob(Job[Numbered], name="scheduling-tests.rated"):
    keep_after_completed = True

    def prepare_steps(self, request: Numbered):
        return [
            self.create_step(RatedCall, request.model_copy(update={"n": n}))
            for n in range(request.steps)
        ]


def began(directory: Path) -> list[tuple[float, str]]:
    """When each rated call began, and on which node, in order."""
    found = [path.read_text().split() for path in directory.iterdir()]
    return sorted((float(when), node) for when, node in found)


SERVICE = "scheduling-tests-service"
CAPACITY = 1
"""Calls the fake service takes at once (the worker hosts can make two)."""


class ThrottlingService:
    """A named actor that answers "throttled" (False) beyond `CAPACITY` calls in flight."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.throttled = 0

    async def call(self) -> bool:
        if self.in_flight >= CAPACITY:
            self.throttled += 1
            return False
        self.in_flight += 1
        try:
            await asyncio.sleep(0.02)
            return True
        finally:
            self.in_flight -= 1

    async def throttled_calls(self) -> int:
        return self.throttled


class Request(BaseModel):
    n: int = 0
    steps: int = 1


class CallService(JobStep[Request, Request, int], name="scheduling-tests.call-service"):
    adaptive = AdaptiveConcurrency(limit=32)
    retry_policy = RetryPolicy(
        initial_interval=timedelta(milliseconds=20), backoff_coefficient=1.0, maximum_attempts=500
    )

    def initialize_state(self, request: Request) -> Request:
        return request

    async def perform(self, state: Request, ctx: StepContext) -> int:
        import ray

        if not await ray.get_actor(SERVICE, namespace=GATE_NAMESPACE).call.remote():
            raise StepFailed("the service throttles", throttled=True)
        return state.n


class CallsJob(Job[Request], name="scheduling-tests.calls"):
    keep_after_completed = True

    def prepare_steps(self, request: Request):
        return [
            self.create_step(CallService, request.model_copy(update={"n": n}))
            for n in range(request.steps)
        ]
