"""The fan-out benchmark: a job of N no-op steps, beside plain Ray measured in the same run.

`choreography bench` runs it with a small N; `benchmarks/fanout.py` with N up to 100,000.
Latency is per step, from the job's dispatch (its Running status) to the step's persisted
outcome, read back from storage.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .jobs.functions import step
from .jobs.job import Job, StepDetails
from .jobs.state import JobKey
from .jobs.status import JobStatus
from .jobs.step import JobStep, StepContext


class BenchRequest(BaseModel):
    steps: int


class NoopItem(BaseModel):
    n: int


class NoopStep(JobStep[NoopItem, NoopItem, int], name="choreography.bench.noop"):
    state_is_request = True  # its state is its request, unchanged

    def initialize_state(self, request: NoopItem) -> NoopItem:
        return request

    async def perform(self, state: NoopItem, ctx: StepContext) -> int:
        return state.n


@step(name="choreography.bench.map-noop")
async def map_noop(n: int) -> int:
    """The no-op step function `jobs.map` runs in `benchmarks/fanout.py --map`."""
    return n


@step(name="choreography.bench.map-sleep")
async def map_sleep(n: int) -> int:
    """A step function that waits 10 ms, as an I/O call would."""
    await asyncio.sleep(0.01)
    return n


@step(name="choreography.bench.map-spin")
def map_spin(n: int) -> int:
    """A synchronous step function that keeps a CPU busy for 5 ms (a Ray task on a CPU)."""
    until = time.process_time() + 0.005
    while time.process_time() < until:
        pass
    return n


class NoopFanOut(Job[BenchRequest], name="choreography.bench.fan-out"):
    keep_after_completed = True  # the benchmark reads the step outcomes back

    def prepare_steps(self, request: BenchRequest) -> Iterable[StepDetails]:
        return [self.create_step(NoopStep, NoopItem(n=n)) for n in range(request.steps)]


class NoopFanOutInBackground(NoopFanOut, name="choreography.bench.fan-out-background"):
    """The fan-out that `start()` returns from once the job and its plan are durable, its steps
    prepared behind it: how a job of a million steps is started (`benchmarks/scale.py`). Its
    steps come from a generator, as docs/planning.md advises for large plans: a list of a
    million steps would hold about 300 MB in the controller host before planning begins."""

    start_steps_in_background = True

    def prepare_steps(self, request: BenchRequest) -> Iterable[StepDetails]:
        return (self.create_step(NoopStep, NoopItem(n=n)) for n in range(request.steps))


@dataclass
class FanOutRun:
    label: str
    steps: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    writes: dict[str, int] = field(default_factory=dict)
    rss_peak_mb: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.steps / self.seconds

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def host_stats(namespace: str) -> dict[str, dict[str, Any]]:
    import ray

    from .runtime.constants import controller_name, worker_name

    node = ray.get_runtime_context().get_node_id()
    controller: Any = ray.get_actor(controller_name(node), namespace=namespace)
    stats = {"controller": ray.get(controller.stats.remote())}
    workers = []
    index = 0
    while True:  # every worker host of this node, summed; peak memory is the largest
        try:
            handle: Any = ray.get_actor(worker_name(node, index), namespace=namespace)
        except ValueError:
            break
        workers.append(ray.get(handle.stats.remote()))
        index += 1
    summed: dict[str, Any] = {"pids": [entry.get("pid") for entry in workers]}
    for entry in workers:
        for name, value in entry.items():
            if name == "pid":
                continue
            if name.startswith("rss"):
                summed[name] = max(summed.get(name, 0), value)
            else:
                summed[name] = summed.get(name, 0) + value
    stats["worker"] = summed
    return stats


def _writes(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, int]:
    def delta(role: str, name: str) -> int:
        return int(after[role].get(name, 0)) - int(before[role].get(name, 0))

    return {
        "job_writes": delta("controller", "job_writes"),
        "step_rows": delta("controller", "step_rows") + delta("worker", "step_rows"),
        "step_batches": delta("controller", "step_batches") + delta("worker", "step_batches"),
    }


async def dispatch_latencies(
    storage_url: str, namespace: str, job_ids: Sequence[str]
) -> dict[str, list[float]]:
    """Per job, each step's seconds from the job's dispatch (its Running status) to the
    step's outcome, read from storage."""
    from .jobs.options import JobsOptions
    from .runtime.cluster_storage import open_cluster_storage

    provider = open_cluster_storage(
        storage_url, namespace=namespace, modules=[__name__], options=JobsOptions()
    )
    await provider.initialize()
    found: dict[str, list[float]] = {}
    try:
        storage = provider.for_key(JobKey())
        for job_id in job_ids:
            job = await storage.jobs.get(job_id)
            dispatched = next(
                c.occurred for c in job.status_changes if c.status == JobStatus.RUNNING
            )
            found[job_id] = [
                (step.status_changes[-1].occurred - dispatched).total_seconds()
                for step in await storage.steps.get_for_job(job_id)
                if step.status_changes
            ]
    finally:
        await provider.close()
    return found


def _released(
    namespace: str,
    before: dict[str, dict[str, Any]],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, dict[str, Any]]:
    """The hosts' statistics once the finished job's activation has let go (within 10 s of
    `clock`): a controller counts the writes of released activations only, and a large job
    can still be held when its terminal status is read (its writes then went uncounted)."""
    live = before["controller"].get("live_jobs", 0)
    deadline = clock() + 10.0
    after = host_stats(namespace)
    while after["controller"].get("live_jobs", 0) > live and clock() < deadline:
        sleep(0.05)
        after = host_stats(namespace)
    return after


def run_fanout(
    jobs: Any,
    steps: int,
    storage_url: str,
    label: str,
    window: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> FanOutRun:
    """One job of `steps` no-op steps, from `start()` to its completion.

    `window` wraps exactly that span (the benchmark's CPU reading and profiler), leaving out
    the reading back of latencies and statistics, which is the benchmark's own work.
    """
    before = host_stats(jobs.namespace)
    with window():
        began = time.perf_counter()
        job_id = jobs.start(NoopFanOut, BenchRequest(steps=steps))
        state = jobs.wait(job_id, interval=0.005)
        seconds = time.perf_counter() - began
    if state is None or state.status != JobStatus.COMPLETED_SUCCESSFULLY:
        raise RuntimeError(f"the benchmark job ended {state.status if state else 'cleared'}")
    after = _released(jobs.namespace, before)
    latencies = asyncio.run(dispatch_latencies(storage_url, jobs.namespace, [job_id]))[job_id]
    return FanOutRun(
        label=label,
        steps=steps,
        seconds=seconds,
        latencies=latencies,
        writes=_writes(before, after),
        rss_peak_mb={role: after[role]["rss_peak_kb"] / 1024 for role in after},
    )


def code_mismatch(driver: str, workers: str) -> str | None:
    """Why a measurement would mix two copies of the code: Ray's workers import
    `choreography_ray` from `workers` and this driver from `driver` (None when they are the
    same files)."""
    if Path(driver).resolve() == Path(workers).resolve():
        return None
    return (
        f"Ray's workers import choreography_ray from {workers} but this driver from {driver}: "
        "Ray puts the driver's working directory first on its workers' path. Run the benchmark "
        "from the checkout whose code it measures, with PYTHONPATH=. (or that checkout "
        "installed with pip install -e), as benchmarks/RESULTS.md says"
    )


def check_same_code(timeout: float = 60.0) -> None:
    """Raise `ConfigurationError` unless the workers of the connected local Ray import
    `choreography_ray` from where this driver does: comparing an old version on `PYTHONPATH`,
    started from the new checkout, measured the new code in every host (fifteenth sitting)."""
    import ray

    from .jobs.errors import ConfigurationError

    def package_file() -> str:
        # Defined here, so that Ray sends it by value: a worker of another copy of the
        # package may not have this module, or this function, at all.
        from importlib.util import find_spec

        spec = find_spec("choreography_ray")
        return "" if spec is None or spec.origin is None else spec.origin

    workers = ray.get(ray.remote(package_file).options(num_cpus=0).remote(), timeout=timeout)
    problem = code_mismatch(package_file(), workers)
    if problem is not None:
        raise ConfigurationError(problem)


def plain_ray_tasks(steps: int, sleep: float = 0.0) -> float:
    """Seconds for `ray.get` over `steps` remote calls that return at once, or after `sleep`
    seconds (Ray's default task options: one CPU each)."""
    import ray

    @ray.remote
    def noop(n: int) -> int:
        if sleep:
            time.sleep(sleep)
        return n

    ray.get(noop.remote(0))  # warm a worker
    began = time.perf_counter()
    ray.get([noop.remote(n) for n in range(steps)])
    return time.perf_counter() - began


def actor_per_step(steps: int) -> float:
    """Seconds for the naive design: one detached actor per step, created, called, killed."""
    import ray

    @ray.remote(num_cpus=0)
    class StepActor:
        def perform(self, n: int) -> int:
            return n

    began = time.perf_counter()
    # mypy keeps a decorated class's own type: it cannot see that ray.remote made an ActorClass.
    actors = [
        StepActor.options(  # type: ignore[attr-defined]
            lifetime="detached", name=f"bench-step-{n}-{time.time_ns()}"
        ).remote()
        for n in range(steps)
    ]
    ray.get([actor.perform.remote(n) for n, actor in enumerate(actors)])
    seconds = time.perf_counter() - began
    for actor in actors:
        ray.kill(actor)
    return seconds


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
