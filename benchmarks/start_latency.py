"""How long `start()` takes to return a durable job, a small job to complete, and a single
step to go from its dispatch to its stored outcome.

    python benchmarks/start_latency.py --jobs 200 --steps 1,10

On a local Ray with SQLite, jobs one after the other (an idle cluster). `start()` returns once
the job, its plan and its steps are stored and the steps are dispatched; "completes" is from
the call to the job's terminal status, seen by polling every millisecond; "dispatch to stored
outcome" is, for one-step jobs, from the job's Running status (its dispatch) to the step's
outcome as stored, both read from storage afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import ray

import choreography_ray as cr
from choreography_ray.bench import BenchRequest, NoopFanOut, check_same_code, dispatch_latencies
from choreography_ray.runtime import stop_hosts


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _row(name: str, values: list[float]) -> str:
    return (
        f"| {name} | {_percentile(values, 0.5) * 1000:.1f} | "
        f"{_percentile(values, 0.99) * 1000:.1f} | {statistics.mean(values) * 1000:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="jobs per size")
    parser.add_argument("--steps", default="1,10", help="steps per job, comma-separated sizes")
    args = parser.parse_args()
    sizes = [int(size) for size in args.steps.split(",")]
    ray.init(
        num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR", log_to_driver=False
    )
    rows: list[str] = []
    try:
        check_same_code()
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'jobs.db'}"
            jobs = cr.connect(url, namespace="bench-start", modules=["choreography_ray.bench"])
            for _ in range(10):  # warm-up: imports, connections, first activations
                jobs.wait(jobs.start(NoopFanOut, BenchRequest(steps=1)), interval=0.001)
            for size in sizes:
                starts, completions, job_ids = [], [], []
                for _ in range(args.jobs):
                    began = time.perf_counter()
                    job_id = jobs.start(NoopFanOut, BenchRequest(steps=size))
                    starts.append(time.perf_counter() - began)
                    jobs.wait(job_id, interval=0.001)
                    completions.append(time.perf_counter() - began)
                    job_ids.append(job_id)
                rows.append(_row(f"start() of a {size}-step job returns it durable", starts))
                rows.append(_row(f"a {size}-step job completes", completions))
                if size == 1:
                    found = asyncio.run(dispatch_latencies(url, "bench-start", job_ids))
                    dispatch = [seconds for job in found.values() for seconds in job]
                    rows.append(_row("a single step: dispatch to stored outcome", dispatch))
    finally:
        stop_hosts("bench-start")
        ray.shutdown()
    print(f"{args.jobs} jobs per size, SQLite, local Ray ({os.cpu_count()} cores)\n")
    print("| measure | p50 ms | p99 ms | mean ms |")
    print("|---|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
