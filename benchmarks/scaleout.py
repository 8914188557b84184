"""Throughput as worker nodes are added, on a multi-node Ray on this one machine.

    python benchmarks/scaleout.py                          # 1, 2 and 4 worker nodes
    python benchmarks/scaleout.py --nodes 1,2 --steps 2000 --window 16

For each number of worker nodes, a cluster of one controller node and that many worker nodes
(`MultiNodeCluster`, one CPU each, SQLite) runs two `jobs.map` jobs, one after the other:

    I/O-bound   `--steps` async steps that each wait 10 ms (`choreography_ray.bench.map_sleep`)
    CPU-bound   `--cpu-steps` synchronous steps that each keep a CPU busy 5 ms (`map_spin`)

An I/O-bound step costs the node a few hundred microseconds of CPU and a slot of its window
for 10 ms, so its throughput grows with the nodes' windows (nodes * `--window` / 10 ms) until
the machine's cores are spent on the hosts' own bookkeeping; a CPU-bound step needs a core for
its whole run, so its throughput is the machine's cores / 5 ms however many nodes share them.
`--window` sets each worker node's `max_parallel_steps` (unset: the default, 128 async steps
per CPU). Each cluster is shut down before the next starts.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from profiling import cpu_seconds

import choreography_ray as cr
from choreography_ray.bench import map_sleep, map_spin
from choreography_ray.testing import MultiNodeCluster


def _run(jobs: cr.Jobs, function, steps: int) -> tuple[float, float]:
    cpu = cpu_seconds()
    began = time.perf_counter()
    state = jobs.map(function, range(steps)).wait()
    seconds = time.perf_counter() - began
    if state is None or state.status != cr.JobStatus.COMPLETED_SUCCESSFULLY:
        raise RuntimeError(f"a job ended {state.status if state else 'cleared'}")
    return steps / seconds, cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,2,4", help="worker node counts to run")
    parser.add_argument("--steps", type=int, default=4000, help="I/O-bound steps per job")
    parser.add_argument("--cpu-steps", type=int, default=400, help="CPU-bound steps per job")
    parser.add_argument("--window", type=int, default=0, help="max_parallel_steps per node")
    args = parser.parse_args()
    options = cr.JobsOptions(max_parallel_steps=args.window) if args.window else None
    print(f"machine: {os.cpu_count()} cores; window per worker node: {args.window or 'default'}")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for count in [int(n) for n in args.nodes.split(",")]:
            url = f"sqlite:///{Path(folder) / f'scale-{count}.db'}"
            layout = ("controller", *["worker"] * count)
            cluster = MultiNodeCluster(
                url, nodes=layout, modules=["choreography_ray.bench"], options=options
            )
            with cluster:
                jobs = cluster.jobs
                jobs.map(map_sleep, range(50)).wait()  # warm the hosts
                io_rate, io_cpu = _run(jobs, map_sleep, args.steps)
                cpu_rate, _ = _run(jobs, map_spin, args.cpu_steps)
            rows.append((count, io_rate, io_cpu / args.steps * 1e6, cpu_rate))
            print(
                f"{count} worker node(s): I/O-bound {io_rate:,.0f} steps/s "
                f"({io_cpu / args.steps * 1e6:,.0f} us CPU/step), "
                f"CPU-bound {cpu_rate:,.0f} steps/s",
                flush=True,
            )
    base = rows[0]
    print("\n| worker nodes | I/O-bound steps/s | vs 1 node | CPU us/step | CPU-bound steps/s |")
    print("|---:|---:|---:|---:|---:|")
    for count, io_rate, io_cpu, cpu_rate in rows:
        print(
            f"| {count} | {io_rate:,.0f} | {io_rate / base[1]:.2f}x | {io_cpu:,.0f} | "
            f"{cpu_rate:,.0f} |"
        )


if __name__ == "__main__":
    main()
