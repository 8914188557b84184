"""How long recovery takes on a multi-node Ray on this machine (`MultiNodeCluster`, SQLite).

    python benchmarks/recovery.py                  # both measures, about 3 minutes
    python benchmarks/recovery.py --steps 10000 --jobs 100

(a) A worker node removed at 30 % of a job of `--steps` steps (two worker nodes): the seconds
Ray took to declare the node dead, and the seconds from the removal to the job's completion,
beside the seconds the same remaining work takes without a fault, on two worker nodes (the
run before) and on the one that is left (the run after). The target is completion within
Ray's detection time + 2 s of the fault-free time on the node that is left.

(b) A whole-cluster restart with `--jobs` unfinished jobs: the seconds from the start of the
restart until every job runs again (owned by a controller host of the new cluster), and how
much of it the cluster's own start took.

Ray's health checks are lowered (`HealthChecks()`, about 1.5 s to declare a node dead); the
job system's options are the defaults but `max_parallel_steps`. Storage is read directly.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from choreography_ray.jobs import JobKey, JobsOptions, JobState, JobStatus
from choreography_ray.jobs.status import JobStepStatus
from choreography_ray.storage import open_storage
from choreography_ray.testing import MultiNodeCluster
from choreography_ray.testing.side_effects import MODULE, Effects, RecordRuns, SideEffects
from choreography_ray.testing.waiting import eventually

POLL = 0.05


def _jobs(url: str, job_ids: list[str]) -> list[JobState | None]:
    async def read() -> list[JobState | None]:
        async with open_storage(url) as provider:
            jobs = provider.for_key(JobKey()).jobs
            return [await jobs.find(job_id) for job_id in job_ids]

    return asyncio.run(read())


def _successes(url: str, job_id: str) -> int:
    async def read() -> int:
        async with open_storage(url) as provider:
            counts = await provider.for_key(JobKey()).steps.count_by_status(job_id)
            return counts.get(JobStepStatus.COMPLETED_SUCCESSFULLY, 0)

    return asyncio.run(read())


def _until(check: Callable[[], Any], within: float, what: str) -> Any:
    return eventually(check, what, within, every=POLL)


def _finished(url: str, job_id: str) -> bool:
    job = _jobs(url, [job_id])[0]
    return job is not None and job.status.is_terminal


def worker_node_removed(steps: int, step_seconds: float, parallel: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'jobs.db'}"
        table = SideEffects(Path(tmp) / "effects.db")
        request = Effects(table=str(table.path), steps=steps, step_seconds=step_seconds)
        with MultiNodeCluster(
            url,
            nodes=("controller", "worker", "worker"),
            modules=[MODULE],
            options=JobsOptions(max_parallel_steps=parallel),
        ) as cluster:
            # Without a fault: how long the work after the 30 % mark takes.
            job_id = cluster.jobs.start(RecordRuns, request)
            _until(lambda: _successes(url, job_id) >= 0.3 * steps, 300, "30 % (no fault)")
            mark = time.monotonic()
            _until(lambda: _finished(url, job_id), 300, "completion (no fault)")
            remaining = time.monotonic() - mark

            job_id = cluster.jobs.start(RecordRuns, request)
            _until(lambda: _successes(url, job_id) >= 0.3 * steps, 300, "30 %")
            before = table.mark()
            node_id = cluster.remove_node("worker")
            removed = time.monotonic()
            dead = cluster.wait_node_dead(node_id)
            _until(lambda: _finished(url, job_id), 300, "completion after the removal")
            completed = time.monotonic() - removed
            state = _jobs(url, [job_id])[0]
            assert state is not None and state.status == JobStatus.COMPLETED_SUCCESSFULLY
            assert state.progress.successful_steps == steps
            again = len([run for run in table.runs(before) if run.job_id == job_id])
            ran_twice = again - (steps - _count_before(table, job_id, before))
            # The same work with the one worker node that is left, and no fault.
            job_id = cluster.jobs.start(RecordRuns, request)
            _until(lambda: _successes(url, job_id) >= 0.3 * steps, 300, "30 % (one node)")
            mark = time.monotonic()
            _until(lambda: _finished(url, job_id), 300, "completion (one node)")
            return {
                "remaining_one": time.monotonic() - mark,
                "remaining": remaining,
                "dead": dead,
                "completed": completed,
                "detection": cluster.health.detection_seconds,
                "ran_twice": float(ran_twice),
            }


def _count_before(table: SideEffects, job_id: str, before: int) -> int:
    """Steps of the job that had begun a run by position `before`."""
    return len({run.step_id for run in table.runs() if run.job_id == job_id and run.seq <= before})


def whole_cluster_restart(jobs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'jobs.db'}"
        table = SideEffects(Path(tmp) / "effects.db")
        # Steps that outlast the measure, so that every job is unfinished at the restart.
        request = Effects(table=str(table.path), steps=2, step_seconds=600)
        with MultiNodeCluster(url, nodes=("controller", "worker"), modules=[MODULE]) as cluster:
            job_ids = [cluster.jobs.start(RecordRuns, request) for _ in range(jobs)]
            began = time.monotonic()
            cluster.restart()
            restarted = time.monotonic() - began
            controllers = {name for name in cluster.host_names() if ":controller:" in name}

            def all_running() -> bool:
                found = _jobs(url, job_ids)
                return all(
                    job is not None
                    and job.status == JobStatus.RUNNING
                    and job.owner is not None
                    and job.owner.host in controllers
                    for job in found
                )

            _until(all_running, 300, "every job running again")
            return {"restart": restarted, "running": time.monotonic() - began}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--step-seconds", type=float, default=0.005)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()

    lost = worker_node_removed(args.steps, args.step_seconds, args.parallel)
    print(
        f"(a) {args.steps} steps of {args.step_seconds * 1000:g} ms, two worker nodes, "
        f"max_parallel_steps={args.parallel}; a worker node removed at 30 %\n"
    )
    print("| measure | seconds |")
    print("|---|---:|")
    print(f"| the remaining 70 % without a fault, two worker nodes | {lost['remaining']:.2f} |")
    print(
        f"| the same, one worker node (what is left after the removal) "
        f"| {lost['remaining_one']:.2f} |"
    )
    print(
        f"| Ray declares the node dead (lowered checks, worst case {lost['detection']:g}) "
        f"| {lost['dead']:.2f} |"
    )
    print(f"| removal to the job's completion | {lost['completed']:.2f} |")
    print(
        f"| target: detection + fault-free time on one node + 2 s | "
        f"{lost['dead'] + lost['remaining_one'] + 2:.2f} |"
    )
    print(f"\nsteps that ran twice: {lost['ran_twice']:.0f}\n")

    restart = whole_cluster_restart(args.jobs)
    print(
        f"(b) whole-cluster restart (controller + worker node) with {args.jobs} unfinished jobs\n"
    )
    print("| measure | seconds |")
    print("|---|---:|")
    print(
        f"| the cluster's restart (processes killed, nodes started, hosts connected) "
        f"| {restart['restart']:.2f} |"
    )
    print(f"| restart begun to every job running again | {restart['running']:.2f} |")


if __name__ == "__main__":
    main()
