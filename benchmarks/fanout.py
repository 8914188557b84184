"""Durable fan-out against plain Ray, measured in one run on one machine.

    python benchmarks/fanout.py --sizes 10000 --runs 3
    python benchmarks/fanout.py --sizes 10000 --runs 3 --configs default,tuned,leases,pg-tuned \
        --peers dbos --plot benchmarks/fanout.png
    python benchmarks/fanout.py --soak 100        # host memory across 100 jobs of 1,000 steps
    python benchmarks/fanout.py --fairness --fairness-steps 100000   # a small job beside a large
    python benchmarks/fanout.py --map --sizes 10000,100000   # jobs.map beside ray.get, 2 kinds
    python benchmarks/fanout.py --waves 1,2,5,10 --sizes 10000 --runs 3   # N steps as W jobs

For each N: plain Ray tasks (`ray.get` over N no-op remote calls) and a job of N no-op async
steps in each configuration of `--configs`:

    default     SQLite, default options (worker hosts per node from the node's CPUs)
    tuned       SQLite, max_parallel_steps=--tuned
    wide        tuned, --workers worker hosts per node (given explicitly)
    leases      tuned, step_lease_timeout=30s (leases on)
    pg-default  PostgreSQL (--postgres), default options
    pg-tuned    PostgreSQL, max_parallel_steps=--tuned

Medians of `--runs` runs for N <= 10,000 (one run above); ratios are to plain Ray measured in
the same invocation. CPU per 10,000 steps is the CPU time of the driver and every process Ray
started (user + system, read from the operating system around each run). `--actor-per-step`
adds the naive design (one detached Ray actor per step, N <= 200); `--peers dbos` adds DBOS
Transact (one workflow with one step per unit through a DBOS queue, on SQLite and, with a
pg configuration, PostgreSQL; `pip install -e '.[bench]'`). The last line, `ratio ...`, is
for scripts.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path

import ray
from profiling import Recording, cpu_by_role, cpu_seconds, process_cpu, thread_cpu

import choreography_ray as cr
from choreography_ray.bench import (
    BenchRequest,
    NoopFanOut,
    actor_per_step,
    check_same_code,
    host_stats,
    map_noop,
    map_sleep,
    median,
    plain_ray_tasks,
    run_fanout,
)
from choreography_ray.runtime import stop_hosts

POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
CONFIGS = ("default", "tuned", "wide", "leases", "pg-default", "pg-tuned")


@dataclass
class Config:
    name: str
    storage: str
    max_parallel_steps: int | None = None
    workers: int | None = None
    """Worker hosts per node; None: the default, derived from the node's CPUs."""
    options: cr.JobsOptions | None = None
    jobs: object = None
    runs: list = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return f"bench-{self.name}"


def _configs(args: argparse.Namespace, workdir: Path) -> list[Config]:
    wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(wanted) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"--configs: unknown {', '.join(unknown)} (known: {', '.join(CONFIGS)})")
    schema = _schema_name()
    postgres = f"{args.postgres}?schema={schema}"

    def made(name: str) -> Config:
        sqlite = f"sqlite:///{workdir / name}.db"
        tuned = args.tuned
        return {
            "default": lambda: Config(name, sqlite),
            "tuned": lambda: Config(name, sqlite, tuned),
            "wide": lambda: Config(name, sqlite, tuned, args.workers),
            "leases": lambda: Config(
                name,
                sqlite,
                tuned,
                options=cr.JobsOptions(step_lease_timeout=timedelta(seconds=30)),
            ),
            "pg-default": lambda: Config(name, postgres),
            "pg-tuned": lambda: Config(name, postgres, tuned),
        }[name]()

    configs = [made(name) for name in wanted]
    if any(c.storage.startswith("postgresql") for c in configs):
        _fresh_schema(args.postgres, schema)
    for config in configs:
        config.jobs = cr.connect(
            config.storage,
            namespace=config.namespace,
            modules=["choreography_ray.bench"],
            options=config.options,
            max_parallel_steps=config.max_parallel_steps,
            workers_per_node=config.workers,
        )
    return configs


def _schema_name() -> str:
    """This run's PostgreSQL schema: the pg-* configurations' tables, dropped when it ends."""
    return f"bench_{os.getpid()}"


def _fresh_schema(url: str, schema: str, *, create: bool = True) -> None:
    """Each PostgreSQL configuration's tables in a schema of this run, dropped first (and,
    without `create`, only dropped: the run leaves nothing on a shared server)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        if create:
            connection.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    engine.dispose()


def _measured(what, *args):
    cpu = cpu_seconds()
    result = what(*args)
    return result, cpu_seconds() - cpu


@contextmanager
def _window(spent: list[float], config: Config, n: int, profile: Path | None):
    """The CPU of a job's run from `start()` to its terminal status; with `profile`, that
    span's CPU by process and by host thread, and sampled stacks of the driver and the hosts."""
    recording = None
    if profile is not None:
        stats = host_stats(config.namespace)
        pids = {"driver": os.getpid(), "controller": stats["controller"]["pid"]}
        pids.update({f"worker{i}": pid for i, pid in enumerate(stats["worker"]["pids"])})
        recording = Recording(profile, f"{config.name}-{n}")
        recording.start(pids)
        by_process = process_cpu()
        by_thread = {role: thread_cpu(pid) for role, pid in pids.items()}
    cpu = cpu_seconds()
    try:
        yield
    finally:
        spent.append(cpu_seconds() - cpu)
        if recording is not None:
            roles = cpu_by_role(by_process, process_cpu())
            recording.stop()
            print(
                f"\nCPU by process, {config.name}, N={n} (seconds; py-spy's own left out): "
                + ", ".join(
                    f"{role} {seconds:.2f}"
                    for role, seconds in roles.most_common()
                    if seconds >= 0.01
                )
            )
            for role, pid in pids.items():
                threads = thread_cpu(pid)
                threads.subtract(by_thread[role])
                print(
                    f"CPU by thread, {role} (seconds): "
                    + ", ".join(f"{name} {s:.2f}" for name, s in threads.most_common() if s >= 0.01)
                )
            print(recording.summary(), flush=True)


def fanout(args: argparse.Namespace, workdir: Path) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    configs = _configs(args, workdir)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    rows = []
    for n in sizes:
        runs = args.runs if n <= 10_000 else 1
        ray_seconds: list[float] = []
        ray_cpu: list[float] = []
        for config in configs:
            config.runs, config.cpu = [], []
        peer_rates: dict[str, list[float]] = {}
        for _ in range(runs):
            seconds, cpu = _measured(plain_ray_tasks, n)
            ray_seconds.append(seconds)
            ray_cpu.append(cpu)
            for config in configs:
                spent: list[float] = []
                profile = args.profile and n == sizes[-1] and len(config.runs) == 0
                window = partial(_window, spent, config, n, Path(args.profile) if profile else None)
                run = run_fanout(config.jobs, n, config.storage, config.name, window)
                config.runs.append(run)
                config.cpu.append(spent[0])
            for peer in peers if n <= args.peer_max and len(ray_seconds) <= args.peer_runs else ():
                for storage_kind in _peer_storages(configs):
                    label = f"{peer} ({storage_kind})"
                    peer_rates.setdefault(label, []).append(
                        n / _peer(peer, n, storage_kind, args, workdir)
                    )
        actor_rate = n / actor_per_step(n) if args.actor_per_step and n <= 200 else None
        row = (
            n,
            ray_seconds,
            ray_cpu,
            {c.name: (list(c.runs), list(c.cpu)) for c in configs},
            peer_rates,
            actor_rate,
        )
        rows.append(row)
        _print_row(row)
    _print_tables(rows, configs)
    if args.plot:
        _plot(rows, configs, Path(args.plot))
    if args.actor_per_step and all(n > 200 for n in sizes):
        print(f"\none detached actor per step, N = 200: {200 / actor_per_step(200):,.1f} steps/s")
    last = rows[-1]
    ray_rate = last[0] / median(last[1])
    ratios = " ".join(
        f"{name}={median([r.rate for r in runs]) / ray_rate:.2f}"
        for name, (runs, _) in last[3].items()
    )
    peers_line = " ".join(
        f"{label.split()[0]}-{label.split('(')[1].rstrip(')')}={median(rates) / ray_rate:.2f}"
        for label, rates in last[4].items()
    )
    print(f"\nratio N={last[0]} {ratios} {peers_line}".rstrip())


def _peer_storages(configs: list[Config]) -> list[str]:
    kinds = ["sqlite"]
    if any(c.storage.startswith("postgresql") for c in configs):
        kinds.append("postgres")
    return kinds


def _peer(peer: str, n: int, storage_kind: str, args: argparse.Namespace, workdir: Path) -> float:
    if peer != "dbos":
        raise SystemExit(f"--peers: unknown {peer!r} (known: dbos)")
    from dbos_peer import dbos_fanout

    return dbos_fanout(n, storage_kind, args.postgres, workdir)


def _print_row(row) -> None:
    n, ray_seconds, _, configs, peers, _ = row
    cells = [f"plain Ray {n / median(ray_seconds):,.0f}/s"]
    cells += [
        f"{name} {median([r.rate for r in runs]):,.0f}/s" for name, (runs, _) in configs.items()
    ]
    cells += [f"{label} {median(rates):,.0f}/s" for label, rates in peers.items()]
    print(f"N={n}: " + ", ".join(cells), flush=True)


def _print_tables(rows, configs: list[Config]) -> None:
    names = [c.name for c in configs]
    peer_labels = sorted({label for row in rows for label in row[4]})
    print(
        "\n| N | plain Ray tasks | "
        + " | ".join(names + peer_labels)
        + " | "
        + " | ".join(f"{name} / Ray" for name in names + peer_labels)
        + " |"
    )
    print("|---:|" + "---:|" * (1 + 2 * (len(names) + len(peer_labels))))
    for n, ray_seconds, _, by_config, peers, actor_rate in rows:
        ray_rate = n / median(ray_seconds)
        rates = [median([r.rate for r in by_config[name][0]]) for name in names]
        rates += [median(peers[label]) if label in peers else float("nan") for label in peer_labels]
        print(
            f"| {n:,} | {ray_rate:,.0f} | "
            + " | ".join(f"{rate:,.0f}" for rate in rates)
            + " | "
            + " | ".join(f"{rate / ray_rate:.2f}x" for rate in rates)
            + " |"
        )
        if actor_rate:
            print(f"(one detached actor per step, N = {n}: {actor_rate:,.1f} steps/s)")
    print("\nCPU seconds per 10,000 steps (driver and every Ray process; medians)")
    print("| N | plain Ray tasks | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * (1 + len(names)))
    for n, _, ray_cpu, by_config, _, _ in rows:
        cells = [median(ray_cpu) * 10_000 / n] + [
            median(by_config[name][1]) * 10_000 / n for name in names
        ]
        print(f"| {n:,} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    print("\nstep latency, dispatch to persisted outcome (median run), seconds")
    print("| N | config | p50 | p99 |")
    print("|---:|---|---:|---:|")
    for n, _, _, by_config, _, _ in rows:
        for name in names:
            run = _median_run(by_config[name][0])
            print(f"| {n:,} | {name} | {run.percentile(0.5):.3f} | {run.percentile(0.99):.3f} |")
    print("\nstorage writes per step (median run) and peak host memory (MB)")
    print(
        "| N | config | record writes / step | round trips / step | "
        "controller peak RSS | worker peak RSS |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    for n, _, _, by_config, _, _ in rows:
        for name in names:
            run = _median_run(by_config[name][0])
            rows_written = run.writes["job_writes"] + run.writes["step_rows"]
            trips = run.writes["job_writes"] + run.writes["step_batches"]
            print(
                f"| {n:,} | {name} | {rows_written / n:.2f} | {trips / n:.3f} | "
                f"{run.rss_peak_mb['controller']:,.0f} | {run.rss_peak_mb['worker']:,.0f} |"
            )


def _median_run(runs):
    ordered = sorted(runs, key=lambda r: r.rate)
    return ordered[len(ordered) // 2]


def _plot(rows, configs: list[Config], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [row[0] for row in rows]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    axes.plot(sizes, [row[0] / median(row[1]) for row in rows], "o-", label="plain Ray tasks")
    for marker, config in zip("s^Dv<>", configs, strict=False):
        axes.plot(
            sizes,
            [median([r.rate for r in row[3][config.name][0]]) for row in rows],
            f"{marker}-",
            label=f"choreography_ray, {config.name}",
        )
    for label in sorted({label for row in rows for label in row[4]}):
        axes.plot(
            sizes, [median(row[4].get(label, [float("nan")])) for row in rows], "x--", label=label
        )
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("steps in the job (N)")
    axes.set_ylabel("steps per second (end to end)")
    axes.set_title("Durable fan-out on one 2-core node vs plain Ray tasks")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"\nplot: {path}")


def _connect(workdir: Path, name: str):
    url = f"sqlite:///{workdir / name}.db"
    return cr.connect(url, namespace=f"bench-{name}", modules=["choreography_ray.bench"]), url


def map_fanout(args: argparse.Namespace, workdir: Path) -> None:
    """`jobs.map(fn, range(N))` beside `ray.get([f.remote(x) for x in range(N)])`, in one run,
    for a no-op function and one that waits 10 ms (`time.sleep` in the Ray task, as Ray users
    write it; `await asyncio.sleep` in the async step function). One run per N of each; the
    map job's time runs from the call to its last stored outcome, on SQLite, default options."""
    jobs, _ = _connect(workdir, "map")
    for n in [int(s) for s in args.sizes.split(",")]:
        for label, function, sleep in (("no-op", map_noop, 0.0), ("10 ms", map_sleep, 0.01)):
            ray_seconds, ray_cpu = _measured(plain_ray_tasks, n, sleep)
            began, cpu = time.perf_counter(), cpu_seconds()
            state = jobs.map(function, range(n)).wait()
            map_seconds, map_cpu = time.perf_counter() - began, cpu_seconds() - cpu
            assert state is not None and state.progress.successful_steps == n, state
            print(
                f"N={n:,} {label}: ray.get {n / ray_seconds:,.0f}/s ({ray_cpu:.1f} CPU s), "
                f"jobs.map {n / map_seconds:,.0f}/s ({map_cpu:.1f} CPU s), "
                f"ratio {ray_seconds / map_seconds:.2f}",
                flush=True,
            )


def soak(args: argparse.Namespace, workdir: Path) -> None:
    """Host memory across many consecutive jobs: does anything accumulate?"""
    jobs, _ = _connect(workdir, "soak")
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
    jobs, _ = _connect(workdir, "fairness")
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


def waves(args: argparse.Namespace, workdir: Path) -> None:
    """N steps as one job, and as W jobs of N / W started one after another, default options.

    A `start()` returns once its job is Running, so each later job's planning and preparation
    run while the jobs before it run their steps: what overlapping preparation with running
    would give, without changing the engine, at the price of W jobs' own records and hooks.
    Wave counts alternate within each of `--runs` rounds; medians."""
    jobs, _ = _connect(workdir, "waves")
    jobs.wait(jobs.start(NoopFanOut, BenchRequest(steps=2000)), interval=0.005)  # warm-up
    counts = [int(w) for w in args.waves.split(",")]
    for n in [int(s) for s in args.sizes.split(",")]:
        measured: dict[int, list[tuple[float, float]]] = {w: [] for w in counts}
        for _ in range(args.runs):
            for w in counts:
                began, cpu = time.perf_counter(), cpu_seconds()
                started = [jobs.start(NoopFanOut, BenchRequest(steps=n // w)) for _ in range(w)]
                for job_id in started:
                    state = jobs.wait(job_id, interval=0.005)
                    if state is None or state.status != cr.JobStatus.COMPLETED_SUCCESSFULLY:
                        raise RuntimeError(f"a job ended {state.status if state else 'cleared'}")
                seconds = time.perf_counter() - began
                steps = n // w * w
                measured[w].append((steps / seconds, (cpu_seconds() - cpu) / steps * 1e6))
        print(f"\nN={n:,}, medians of {args.runs}")
        print("| jobs | steps/s | CPU µs/step | every run (steps/s) |")
        print("|---:|---:|---:|---|")
        for w, runs in measured.items():
            rates = ", ".join(f"{rate:,.0f}" for rate, _ in runs)
            print(
                f"| {w} | {median([r for r, _ in runs]):,.0f} | "
                f"{median([c for _, c in runs]):.0f} | {rates} |"
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
    parser.add_argument(
        "--profile",
        default="",
        help="a directory: py-spy stacks and CPU by process of each config's first run at the "
        "largest N",
    )
    parser.add_argument(
        "--configs",
        default="default,tuned,wide",
        help=f"comma-separated, of: {', '.join(CONFIGS)}",
    )
    parser.add_argument("--postgres", default=POSTGRES, help="the pg-* configurations' server")
    parser.add_argument("--peers", default="", help="comma-separated, of: dbos")
    parser.add_argument(
        "--peer-runs", type=int, default=1, help="runs of each peer per N (they are slow)"
    )
    parser.add_argument("--peer-max", type=int, default=10_000, help="the largest N a peer runs at")
    parser.add_argument(
        "--actor-per-step", action="store_true", help="also one detached actor per step"
    )
    parser.add_argument("--soak", type=int, default=0, help="jobs to run for the memory soak")
    parser.add_argument("--soak-steps", type=int, default=1000)
    parser.add_argument(
        "--fairness", action="store_true", help="a 10-step job beside a large one, same worker"
    )
    parser.add_argument("--fairness-steps", type=int, default=100_000, help="the large job's")
    parser.add_argument(
        "--waves", default="", help="comma-separated job counts: N steps as W jobs in a row"
    )
    parser.add_argument(
        "--map", action="store_true", help="jobs.map beside ray.get: a no-op, and 10 ms"
    )
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
        check_same_code()
        with tempfile.TemporaryDirectory() as tmp:
            if args.map:
                map_fanout(args, Path(tmp))
            elif args.fairness:
                fairness(args, Path(tmp))
            elif args.soak:
                soak(args, Path(tmp))
            elif args.waves:
                waves(args, Path(tmp))
            else:
                fanout(args, Path(tmp))
    finally:
        for name in (*CONFIGS, "soak", "fairness", "map", "waves"):
            stop_hosts(f"bench-{name}")
        ray.shutdown()
        if "pg-" in args.configs:
            _fresh_schema(args.postgres, _schema_name(), create=False)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
