"""How long `start()` takes to return a durable job, and a one-step job to complete.

    python benchmarks/start_latency.py --jobs 200

On a local Ray with SQLite. `start()` returns once the job, its plan and its step are stored
and the step is dispatched; "complete" is from the call to the job's terminal status, seen by
polling every millisecond.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import ray

import choreography_ray as cr
from choreography_ray.bench import BenchRequest, NoopFanOut
from choreography_ray.runtime import stop_hosts


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    ray.init(
        num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR", log_to_driver=False
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            jobs = cr.connect(
                f"sqlite:///{Path(tmp) / 'jobs.db'}",
                namespace="bench-start",
                modules=["choreography_ray.bench"],
            )
            for _ in range(10):  # warm-up: imports, connections, first activations
                jobs.wait(jobs.start(NoopFanOut, BenchRequest(steps=1)), interval=0.001)
            starts, completions = [], []
            for _ in range(args.jobs):
                began = time.perf_counter()
                job_id = jobs.start(NoopFanOut, BenchRequest(steps=1))
                starts.append(time.perf_counter() - began)
                jobs.wait(job_id, interval=0.001)
                completions.append(time.perf_counter() - began)
    finally:
        stop_hosts("bench-start")
        ray.shutdown()
    print(f"{args.jobs} one-step jobs, SQLite, local Ray ({os.cpu_count()} cores)\n")
    print("| measure | p50 ms | p99 ms | mean ms |")
    print("|---|---:|---:|---:|")
    for name, values in (
        ("start() returns a durable job", starts),
        ("one-step job completes", completions),
    ):
        print(
            f"| {name} | {_percentile(values, 0.5) * 1000:.1f} | "
            f"{_percentile(values, 0.99) * 1000:.1f} | {statistics.mean(values) * 1000:.1f} |"
        )


if __name__ == "__main__":
    main()
