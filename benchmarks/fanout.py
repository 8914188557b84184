"""Durable fan-out against plain Ray, measured in one run on one machine.

    python benchmarks/fanout.py --sizes 1000,10000,100000 --runs 5 --tuned 256 \
        --plot benchmarks/fanout.png
    python benchmarks/fanout.py --soak 100        # host memory across 100 jobs of 1,000 steps
    python benchmarks/fanout.py --fairness --fairness-steps 100000   # a small job beside a large

For each N: a job of N no-op async steps on SQLite with default options and with a tuned
`max_parallel_steps`, plain Ray tasks (`ray.get` over N no-op remote calls), and for N <= 200
one detached Ray actor per step. Medians of `--runs` runs for N <= 10,000 (one run above).
`--fairness` starts a job of 10 steps while a large job's steps are queued on the same worker
host (default options) and reports how long the small job took and the large job's throughput.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import ray

import choreography_ray as cr
from choreography_ray.bench import (
    BenchRequest,
    NoopFanOut,
    actor_per_step,
    host_stats,
    median,
    plain_ray_tasks,
    run_fanout,
)
from choreography_ray.runtime import stop_hosts


def _connect(workdir: Path, name: str, max_parallel_steps: int | None, workers: int = 1):
    url = f"sqlite:///{workdir / name}.db"
    jobs = cr.connect(
        url,
        namespace=f"bench-{name}",
        modules=["choreography_ray.bench"],
        max_parallel_steps=max_parallel_steps,
        workers_per_node=workers,
    )
    return jobs, url


def fanout(args: argparse.Namespace, workdir: Path) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    default, default_url = _connect(workdir, "default", None)
    tuned, tuned_url = _connect(workdir, "tuned", args.tuned)
    wide, wide_url = _connect(workdir, "wide", args.tuned, args.workers)
    rows = []
    for n in sizes:
        runs = args.runs if n <= 10_000 else 1
        ray_seconds, default_runs, tuned_runs, wide_runs = [], [], [], []
        for _ in range(runs):
            ray_seconds.append(plain_ray_tasks(n))
            default_runs.append(run_fanout(default, n, default_url, "default"))
            tuned_runs.append(run_fanout(tuned, n, tuned_url, f"max_parallel_steps={args.tuned}"))
            wide_runs.append(
                run_fanout(wide, n, wide_url, f"+ {args.workers} worker hosts per node")
            )
        actor_rate = None
        if n <= 200:  # about 3 actors/s: one run is minutes already
            actor_rate = n / actor_per_step(n)
        rows.append((n, ray_seconds, default_runs, tuned_runs, actor_rate, wide_runs))
        _print_row(rows[-1], args.tuned)
    _print_tables(rows, args.tuned)
    if args.plot:
        _plot(rows, args.tuned, Path(args.plot))
    # An actor-per-step point at N = 200, if the sizes did not include one.
    if all(n > 200 for n in sizes):
        print(f"\none detached actor per step, N = 200: {200 / actor_per_step(200):,.1f} steps/s")


def _print_row(row, tuned: int) -> None:
    n, ray_seconds, default_runs, tuned_runs, _, wide_runs = row
    print(
        f"N={n}: plain Ray {n / median(ray_seconds):,.0f}/s, "
        f"default {median([r.rate for r in default_runs]):,.0f}/s, "
        f"tuned {median([r.rate for r in tuned_runs]):,.0f}/s, "
        f"tuned + worker hosts {median([r.rate for r in wide_runs]):,.0f}/s",
        flush=True,
    )


def _print_tables(rows, tuned: int) -> None:
    print(
        "\n| N | plain Ray tasks | actor per step | choreography default | "
        f"choreography max_parallel_steps={tuned} | same, 2 worker hosts per node | "
        "default / Ray | tuned / Ray | 2 workers / Ray |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, ray_seconds, default_runs, tuned_runs, actor_rate, wide_runs in rows:
        ray_rate = n / median(ray_seconds)
        d = median([r.rate for r in default_runs])
        t = median([r.rate for r in tuned_runs])
        w = median([r.rate for r in wide_runs])
        actor = f"{actor_rate:,.1f}" if actor_rate else "—"
        print(
            f"| {n:,} | {ray_rate:,.0f} | {actor} | {d:,.0f} | {t:,.0f} | {w:,.0f} | "
            f"{d / ray_rate:.1f}x | {t / ray_rate:.1f}x | {w / ray_rate:.1f}x |"
        )
    print("\nstep latency, dispatch to persisted outcome (median run), seconds")
    print(
        "| N | default p50 | default p99 | tuned p50 | tuned p99 | 2 workers p50 | 2 workers p99 |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, _, default_runs, tuned_runs, _, wide_runs in rows:
        cells = []
        for run in (_median_run(default_runs), _median_run(tuned_runs), _median_run(wide_runs)):
            cells += [f"{run.percentile(0.5):.3f}", f"{run.percentile(0.99):.3f}"]
        print(f"| {n:,} | " + " | ".join(cells) + " |")
    print("\nstorage writes per step (median run) and peak host memory (MB)")
    print(
        "| N | config | record writes / step | round trips / step | "
        "controller peak RSS | worker peak RSS |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    for n, _, default_runs, tuned_runs, _, wide_runs in rows:
        for run in (_median_run(default_runs), _median_run(tuned_runs), _median_run(wide_runs)):
            rows_written = run.writes["job_writes"] + run.writes["step_rows"]
            trips = run.writes["job_writes"] + run.writes["step_batches"]
            print(
                f"| {n:,} | {run.label} | {rows_written / n:.2f} | {trips / n:.3f} | "
                f"{run.rss_peak_mb['controller']:,.0f} | {run.rss_peak_mb['worker']:,.0f} |"
            )


def _median_run(runs):
    ordered = sorted(runs, key=lambda r: r.rate)
    return ordered[len(ordered) // 2]


def _plot(rows, tuned: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [row[0] for row in rows]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    axes.plot(sizes, [row[0] / median(row[1]) for row in rows], "o-", label="plain Ray tasks")
    axes.plot(
        sizes,
        [median([r.rate for r in row[2]]) for row in rows],
        "s-",
        label="choreography_ray, default options",
    )
    axes.plot(
        sizes,
        [median([r.rate for r in row[3]]) for row in rows],
        "^-",
        label=f"choreography_ray, max_parallel_steps={tuned}",
    )
    axes.plot(
        sizes,
        [median([r.rate for r in row[5]]) for row in rows],
        "D-",
        label=f"choreography_ray, max_parallel_steps={tuned}, 2 worker hosts per node",
    )
    axes.set_xscale("log")
    axes.set_xlabel("steps in the job (N)")
    axes.set_ylabel("steps per second (end to end)")
    axes.set_title("Durable fan-out on one 2-core node (SQLite) vs plain Ray tasks")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"\nplot: {path}")


def soak(args: argparse.Namespace, workdir: Path) -> None:
    """Host memory across many consecutive jobs: does anything accumulate?"""
    jobs, _ = _connect(workdir, "soak", None)
    samples = []
    for index in range(args.soak):
        job_id = jobs.start(NoopFanOut, BenchRequest(steps=args.soak_steps))
        jobs.wait(job_id, interval=0.005)
        stats = host_stats(jobs.namespace)
        samples.append((stats["controller"]["rss_kb"] / 1024, stats["worker"]["rss_kb"] / 1024))
        if index % 10 == 0:
            print(
                f"job {index}: controller {samples[-1][0]:.0f} MB, worker {samples[-1][1]:.0f} MB",
                flush=True,
            )
    for role, column in (("controller", 0), ("worker", 1)):
        values = [s[column] for s in samples]
        baseline = values[min(9, len(values) - 1)]  # after warm-up
        growth = (values[-1] - baseline) / baseline * 100
        print(
            f"{role}: after job 10 {baseline:.0f} MB, after job {len(values)} {values[-1]:.0f} MB "
            f"({growth:+.1f} %), max {max(values):.0f} MB"
        )


def fairness(args: argparse.Namespace, workdir: Path) -> None:
    """A 10-step job started while a large job runs on the same worker host: how long does it
    take, and how fast does the large job go meanwhile?"""
    jobs, _ = _connect(workdir, "fairness", None)
    warm = jobs.start(NoopFanOut, BenchRequest(steps=100))
    jobs.wait(warm)
    large_steps, small_steps = args.fairness_steps, 10
    began = time.perf_counter()
    large = jobs.start(NoopFanOut, BenchRequest(steps=large_steps))  # returns once dispatched
    dispatched = time.perf_counter() - began
    done_before = jobs.get(large).progress.successful_steps
    small_began = time.perf_counter()
    small = jobs.start(NoopFanOut, BenchRequest(steps=small_steps))
    small_state = jobs.wait(small)
    small_seconds = time.perf_counter() - small_began
    done_after = jobs.get(large).progress.successful_steps
    large_state = jobs.wait(large)
    large_seconds = time.perf_counter() - began
    for state in (small_state, large_state):
        if state is None or state.status != cr.JobStatus.COMPLETED_SUCCESSFULLY:
            raise RuntimeError(f"a job ended {state.status if state else 'cleared'}")
    print(
        f"large job: {large_steps:,} steps, dispatched after {dispatched:.1f} s, done in "
        f"{large_seconds:.1f} s ({large_steps / large_seconds:,.0f} steps/s end to end)"
    )
    print(
        f"small job: {small_steps} steps, started with {done_before:,} of the large job's steps "
        f"done, completed in {small_seconds:.2f} s, while the large job did "
        f"{done_after - done_before:,} steps"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tuned", type=int, default=256)
    parser.add_argument(
        "--workers", type=int, default=2, help="worker hosts per node, third config"
    )
    parser.add_argument("--plot", default="")
    parser.add_argument("--soak", type=int, default=0, help="jobs to run for the memory soak")
    parser.add_argument("--soak-steps", type=int, default=1000)
    parser.add_argument(
        "--fairness", action="store_true", help="a 10-step job beside a large one, same worker"
    )
    parser.add_argument("--fairness-steps", type=int, default=100_000, help="the large job's")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, Ray {ray.__version__}"
    )
    ray.init(
        num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR", log_to_driver=False
    )
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if args.fairness:
                fairness(args, Path(tmp))
            elif args.soak:
                soak(args, Path(tmp))
            else:
                fanout(args, Path(tmp))
    finally:
        for namespace in (
            "bench-default",
            "bench-tuned",
            "bench-wide",
            "bench-soak",
            "bench-fairness",
        ):
            stop_hosts(namespace)
        ray.shutdown()
    print(f"\n(total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
