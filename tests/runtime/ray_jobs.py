"""Jobs the Ray integration tests run; host actors import this module by name."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field

from choreography_ray.jobs import Job, JobStep, StepContext, StepFailed, step


class FanOut(BaseModel):
    steps: int
    fail: list[int] = Field(default_factory=list)
    block: bool = False
    stages: int = 1


class Item(BaseModel):
    n: int
    fail: bool = False
    block: bool = False


class Echo(JobStep[Item, Item, int], name="ray-tests.echo"):
    def initialize_state(self, request: Item) -> Item:
        return request

    async def perform(self, state: Item, ctx: StepContext) -> int:
        if state.block:
            import ray

            # Blocks until the test opens the gate (or the step is stopped).
            await ray.get_actor(GATE, namespace=GATE_NAMESPACE).wait.remote()
        if state.fail:
            raise StepFailed(f"item {state.n} failed")
        return state.n


class Square(JobStep[Item, Item, int], name="ray-tests.square"):
    """A CPU-bound step: a plain `def perform`, run as a Ray task."""

    def initialize_state(self, request: Item) -> Item:
        return request

    def perform(self, state: Item, ctx: StepContext) -> int:
        ctx.progress(50, "halfway")
        ctx.checkpoint(state)
        if state.fail:
            raise StepFailed(f"square {state.n} failed")
        return state.n * state.n


class FanOutJob(Job[FanOut], name="ray-tests.fan-out"):
    keep_after_completed = True

    def prepare_steps(self, request: FanOut):
        return [
            self.create_step(
                Echo,
                Item(n=n, fail=n in request.fail, block=request.block),
                stage=n % request.stages,
            )
            for n in range(request.steps)
        ]


class SquaresJob(Job[FanOut], name="ray-tests.squares"):
    keep_after_completed = True

    def prepare_steps(self, request: FanOut):
        return [
            self.create_step(Square, Item(n=n, fail=n in request.fail))
            for n in range(request.steps)
        ]


GATE = "ray-tests-gate"
GATE_NAMESPACE = "ray-tests"


class Gate:
    """A named actor blocked steps wait on, so a test decides when they may finish."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def wait(self) -> None:
        await self.opened.wait()

    async def open(self) -> None:
        self.opened.set()


def gate() -> object:
    """A fresh gate, closed; kill it when done."""
    import ray

    return (
        ray.remote(Gate)
        .options(name=GATE, namespace=GATE_NAMESPACE, lifetime="detached", num_cpus=0)
        .remote()
    )


def kill_hosts(namespace: str = "choreography", *, workers: bool = False) -> None:
    """Kill this node's controller host (and its worker hosts, with `workers`) and wait,
    bounded, until Ray frees their names, so that the next `connect` starts new ones."""
    import time

    import ray

    from choreography_ray.runtime.constants import WORKER_PREFIX, controller_name

    names = [controller_name(ray.get_runtime_context().get_node_id())]
    if workers:
        names += [
            actor["name"]
            for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["namespace"] == namespace and actor["name"].startswith(WORKER_PREFIX)
        ]
    for name in names:
        ray.kill(ray.get_actor(name, namespace=namespace))
    deadline = time.monotonic() + 30
    for name in names:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=namespace)
            except ValueError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"{name} still runs")


@step(name="ray-tests.triple", num_cpus=0.5)
def triple(value: int) -> int:
    """A plain def step function: each item runs as a Ray task."""
    if value < 0:
        raise ValueError(f"negative: {value}")
    return value * 3


@step(name="ray-tests.halve")
async def halve(value: int, ctx: StepContext) -> float:
    ctx.progress(100, f"attempt {ctx.attempt}")
    return value / 2
