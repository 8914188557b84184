"""Adaptive concurrency against a throttling service on loopback (issue 24).

A small HTTP server on 127.0.0.1 answers 429 ("throttled") to any call beyond `--capacity`
calls in flight and takes `--call-ms` to answer the others. One job of `--calls` steps, each
one HTTP call, runs in an in-process cluster (the engine without Ray, the system clock) with
plenty of worker slots, twice: with a fixed window of `--limit` active steps and with an
adaptive window (`AdaptiveConcurrency(limit=--limit)`). Every half second the adaptive run's
window, the calls answered and the throttled calls are sampled; the table prints them, and
`--plot FILE` draws them (matplotlib, when installed).

    .venv/bin/python benchmarks/adaptive.py --calls 3000 --capacity 16 --limit 128
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from datetime import timedelta
from typing import Any, ClassVar

import aiohttp
from aiohttp import web
from pydantic import BaseModel

from choreography_ray.engine.clock import SystemClock
from choreography_ray.jobs import Job, JobsOptions, JobStep, RetryPolicy, StepFailed
from choreography_ray.jobs.adaptive import AdaptiveConcurrency
from choreography_ray.testing import InProcessCluster


class Service:
    """The throttling service's counters."""

    in_flight = 0
    answered = 0
    throttled = 0
    capacity = 16
    seconds = 0.01
    url = ""


async def handle(_: web.Request) -> web.Response:
    if Service.in_flight >= Service.capacity:
        Service.throttled += 1
        return web.Response(status=429, text="throttled")
    Service.in_flight += 1
    try:
        await asyncio.sleep(Service.seconds)
        Service.answered += 1
        return web.Response(text="ok")
    finally:
        Service.in_flight -= 1


class Call(BaseModel):
    n: int


SESSION: dict[str, aiohttp.ClientSession] = {}
RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=20), backoff_coefficient=1.0, maximum_attempts=10_000
)


class FixedCall(JobStep[Call, Call, int], name="bench.adaptive.fixed-call"):
    retry_policy = RETRY
    adaptive_on: ClassVar[bool] = False

    def initialize_state(self, request: Call) -> Call:
        return request

    async def perform(self, state: Call, ctx: Any) -> int:
        async with SESSION["s"].get(Service.url) as answer:
            if answer.status == 429:
                raise StepFailed("the service throttles", throttled=True)
            return state.n


class AdaptiveCall(FixedCall, name="bench.adaptive.adaptive-call"):
    adaptive = AdaptiveConcurrency(limit=128)


class Calls(BaseModel):
    count: int
    adaptive: bool


class CallsJob(Job[Calls], name="bench.adaptive.calls"):
    keep_after_completed = True
    max_active_steps = 128

    def prepare_steps(self, request: Calls) -> list[Any]:
        step = AdaptiveCall if request.adaptive else FixedCall
        return [self.create_step(step, Call(n=n)) for n in range(request.count)]


async def one_run(calls: int, adaptive: bool) -> dict[str, Any]:
    Service.answered = Service.throttled = 0
    cluster = InProcessCluster(
        options=JobsOptions(max_parallel_steps=512), clock=SystemClock(), max_parallel_steps=512
    )
    samples: list[tuple[float, int | None, int, int]] = []
    async with cluster:
        began = time.perf_counter()
        result = await cluster.start(CallsJob, Calls(count=calls, adaptive=adaptive))
        while True:
            state = await cluster.manager().get(result.job_id)
            window = state.adaptive_window.window if state.adaptive_window else None
            samples.append(
                (time.perf_counter() - began, window, Service.answered, Service.throttled)
            )
            if state.is_finished:
                break
            await asyncio.sleep(0.5)
        seconds = time.perf_counter() - began
    return {
        "seconds": seconds,
        "throughput": Service.answered / seconds,
        "throttled": Service.throttled,
        "window": window,
        "samples": samples,
        "status": state.status.name,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--capacity", type=int, default=16)
    parser.add_argument("--call-ms", type=float, default=10.0)
    parser.add_argument("--plot", default="")
    args = parser.parse_args()
    Service.capacity = args.capacity
    Service.seconds = args.call_ms / 1000
    app = web.Application()
    app.router.add_get("/", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    Service.url = f"http://127.0.0.1:{port}/"
    SESSION["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    try:
        fixed = await one_run(args.calls, adaptive=False)
        adaptive = await one_run(args.calls, adaptive=True)
    finally:
        await SESSION["s"].close()
        await runner.cleanup()
    print(f"capacity {args.capacity} calls at once, {args.call_ms:g} ms a call, {args.calls} calls")
    print("| window | status | seconds | answered/s | throttled calls | final window |")
    print("|---|---|---:|---:|---:|---:|")
    for name, run in (("fixed 128", fixed), ("adaptive, limit 128", adaptive)):
        print(
            f"| {name} | {run['status']} | {run['seconds']:.1f} | {run['throughput']:.0f} "
            f"| {run['throttled']} | {run['window'] if run['window'] is not None else '—'} |"
        )
    print()
    print("| t (s) | window | answered | throttled |")
    print("|---:|---:|---:|---:|")
    for at, window, answered, throttled in adaptive["samples"]:
        print(f"| {at:.1f} | {window} | {answered} | {throttled} |")
    if args.plot:
        plot(adaptive["samples"], args.plot, args.capacity)


def plot(samples: list[tuple[float, int | None, int, int]], path: str, capacity: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [s[0] for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7, 5))
    top.plot(times, [s[1] or 0 for s in samples], label="window")
    top.axhline(capacity, linestyle="--", color="grey", label="service capacity")
    top.set_ylabel("active steps")
    top.legend()
    rates = [0.0] + [(b[2] - a[2]) / (b[0] - a[0]) for a, b in itertools.pairwise(samples)]
    bottom.plot(times, rates, label="answered / s")
    bottom.plot(times, [s[3] for s in samples], label="throttled (total)")
    bottom.set_xlabel("seconds")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    asyncio.run(main())
