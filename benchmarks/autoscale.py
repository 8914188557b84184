"""Scaling from zero on Ray's own autoscaler, on this machine: the node types of
`ray-cluster.yaml` over Ray's fake multi-node provider (`FakeAutoscalingCluster`).

    python benchmarks/autoscale.py                 # 3 runs
    python benchmarks/autoscale.py --runs 5 --steps 600

Each run starts a job with no worker node and measures, from the start: the first worker node
alive (the autoscaler launched it because the elected controller asked), the worker host
ready, the first step begun, the job done; and the seconds from the host being ready to its
first step. Then, while a second job runs on two worker nodes, one is drained with `ray
drain-node` (a 20 s deadline): the seconds until no run begins there any more and until the
job is done, and the steps run twice. Last, the seconds from the end of the work until Ray's
autoscaler removed every worker node (worker_idle_timeout 3 s, the autoscaler's own idle
timeout 15 s). Medians over the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

import choreography_ray as cr
from choreography_ray.jobs import JobKey, JobsOptions
from choreography_ray.storage import open_storage
from choreography_ray.testing.autoscaling import FakeAutoscalingCluster
from choreography_ray.testing.cluster_nodes import drain_node
from choreography_ray.testing.side_effects import MODULE, Effects, RecordRuns, SideEffects
from choreography_ray.testing.waiting import eventually

ROOT = Path(__file__).resolve().parents[1]


def _job(url: str, job_id: str) -> Any:
    async def read() -> Any:
        async with open_storage(url) as provider:
            return await provider.for_key(JobKey()).jobs.find(job_id)

    return asyncio.run(read())


def _done(url: str, job_id: str) -> Any:
    def finished() -> Any:
        job = _job(url, job_id)
        return job if job is not None and job.status.is_terminal else None

    return eventually(finished, "the job finished", 300, every=0.05)


def _ready_at(node_id: str) -> float | None:
    try:
        handle = ray.get_actor(f"choreography:worker:{node_id}", namespace="choreography")
    except ValueError:
        return None
    return ray.get(handle.stats.remote(), timeout=10)["ready_at"]


def one_run(steps: int, step_seconds: float) -> dict[str, float]:
    fake = FakeAutoscalingCluster.from_cluster_yaml(ROOT / "ray-cluster.yaml", max_workers=2)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="autoscale-") as tmp, fake:
        ray.init(address=fake.address, logging_level="ERROR", log_to_driver=False)
        try:
            url = f"sqlite:///{Path(tmp) / 'jobs.db'}"
            options = JobsOptions(
                membership_interval="500ms", autoscale_max_worker_nodes=2, worker_idle_timeout="3s"
            )
            jobs = cr.connect(url, address=fake.address, options=options, modules=[MODULE])
            table = SideEffects(Path(tmp) / "effects.db")
            began = time.time()
            job_id = jobs.start(
                RecordRuns, Effects(table=str(table.path), steps=steps, step_seconds=step_seconds)
            )
            first = eventually(fake.worker_nodes, "a worker node", 120, every=0.05)
            figures["start -> node alive"] = time.time() - began
            node = first[0]["NodeID"]
            ready = eventually(lambda: _ready_at(node), "its worker host ready", 60, every=0.05)
            figures["start -> host ready"] = ready - began
            _done(url, job_id)
            runs = table.runs()
            first_step = min(run.at for run in runs)
            figures["start -> first step"] = first_step - began
            figures["host ready -> first step"] = first_step - ready
            figures["start -> done"] = max(run.at for run in runs) - began

            # A drain, while a job runs on two worker nodes.
            table = SideEffects(Path(tmp) / "drain.db")
            job_id = jobs.start(
                RecordRuns, Effects(table=str(table.path), steps=steps * 2, step_seconds=0.1)
            )
            eventually(lambda: len(fake.worker_nodes()) >= 2, "two worker nodes", 120)
            eventually(lambda: len(table.runs()) > steps // 2, "the job under way", 120)
            drained = fake.worker_nodes()[-1]["NodeID"]
            sent = drain_node(fake.address, drained, deadline=20, message="benchmark")
            _done(url, job_id)
            runs = table.runs()
            there = [run.at for run in runs if run.node == drained]
            figures["drain -> last run begun there"] = max([sent, *there]) - sent
            figures["drain -> job done"] = max(run.at for run in runs) - sent
            counts: dict[str, int] = {}
            for run in runs:
                counts[run.step_id] = counts.get(run.step_id, 0) + 1
            figures["steps run twice (drain)"] = float(sum(n > 1 for n in counts.values()))
            idle = time.time()
            eventually(lambda: not fake.worker_nodes(), "the worker nodes removed", 300)
            figures["work done -> worker nodes removed"] = time.time() - idle
        finally:
            ray.shutdown()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {}
    for n in range(args.runs):
        figures = one_run(args.steps, args.step_seconds)
        print(f"run {n + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()))
        for key, value in figures.items():
            results.setdefault(key, []).append(value)
    print(f"\nmedians of {args.runs} runs ({args.steps} steps of {args.step_seconds} s):")
    for key, values in results.items():
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"  {key}: {statistics.median(values):.2f}  (runs: {each})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
