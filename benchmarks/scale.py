"""Scale: starting large jobs, a million-step job, a thousand concurrent jobs, start latency.

    python benchmarks/scale.py --steps 100000,1000000 --run-steps 1000000 --jobs 1000 \\
        --latency 200 --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        --plot benchmarks/scale_memory.png

Everything runs on one local Ray that the script starts and shuts down. Sections:

- start(): a `NoopFanOutInBackground` job of each `--steps` size, on SQLite (each job then
  runs to completion before the next starts) and, with `--postgres`, on PostgreSQL (in a
  database of its own per size, dropped afterwards; the steps are not run); the time until
  `start()` returns, i.e. until the job and its plan are durable.
- run: while the SQLite job of `--run-steps` steps runs, the resident memory of the
  controller and worker host processes is sampled from /proc every second, and the client's
  get/list and (`--cli`) the `choreography jobs show`/`jobs list` commands are timed every
  `--probe-every` seconds. When it completes, its phases are printed from the job's status
  history: seconds from its creation to PreparingSteps (`start()` has saved the plan), to
  Running (every step prepared and stored) and to its completion.
- jobs: `--jobs` concurrent jobs of 100 steps; time until all complete, controller memory.
- latency: `--latency` one-step jobs after 10 warm-up jobs; `start()` p50/p99.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray

import choreography_ray as cr
from choreography_ray.bench import (
    BenchRequest,
    NoopFanOut,
    NoopFanOutInBackground,
    check_same_code,
)
from choreography_ray.jobs.status import JobStatus
from choreography_ray.runtime import stop_hosts
from choreography_ray.runtime.constants import NAMESPACE, controller_name, worker_name

MODULES = ["choreography_ray.bench"]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def host_pids(namespace: str) -> dict[str, int]:
    """The process id of this node's controller host and of each of its worker hosts (one per
    CPU by default): "controller", "worker", "worker 2", ..."""
    node = ray.get_runtime_context().get_node_id()
    names = [("controller", controller_name(node))]
    names += [(f"worker {i + 1}" if i else "worker", worker_name(node, i)) for i in range(16)]
    pids = {}
    for role, name in names:
        try:
            handle = ray.get_actor(name, namespace=namespace)
        except ValueError:  # no such host: the node runs fewer
            break
        pids[role] = ray.get(handle.__ray_call__.remote(lambda _self: os.getpid()))
    return pids


class MemorySampler:
    """RSS of each host process every `every` seconds, read from /proc by a thread."""

    def __init__(self, pids: dict[str, int], every: float = 1.0) -> None:
        self.pids = pids
        self.every = every
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._began = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            sample = {role: _rss_mb(pid) for role, pid in self.pids.items()}
            self.samples.append(
                (time.perf_counter() - self._began, {r: v for r, v in sample.items() if v})
            )
            self._stop.wait(self.every)

    def peak(self, role: str) -> float:
        return max((s.get(role, 0.0) for _, s in self.samples), default=0.0)


def _connect(url: str, namespace: str, max_parallel_steps: int | None) -> Any:
    return cr.connect(
        url, namespace=namespace, modules=MODULES, max_parallel_steps=max_parallel_steps
    )


def _timed(fn: Any) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


class Probes:
    """Reads while a job runs: the client's get and list, and the CLI's show and list."""

    def __init__(self, jobs: Any, job_id: str, address: str, cli: bool) -> None:
        self.jobs, self.job_id, self.address, self.cli = jobs, job_id, address, cli
        self.times: dict[str, list[float]] = {"client get": [], "client list": []}
        if cli:
            self.times.update({"jobs show (CLI)": [], "jobs list (CLI)": []})

    def once(self) -> None:
        self.times["client get"].append(_timed(lambda: self.jobs.get(self.job_id)))
        self.times["client list"].append(_timed(lambda: self.jobs.list()))
        if self.cli:
            exe = str(Path(sys.executable).with_name("choreography"))
            for label, argv in (
                ("jobs show (CLI)", [exe, "jobs", "show", self.job_id, "--address", self.address]),
                ("jobs list (CLI)", [exe, "jobs", "list", "--address", self.address]),
            ):
                began = time.perf_counter()
                done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
                if done.returncode:  # a failing command is not a reading to time
                    raise RuntimeError(f"{label} exited {done.returncode}: {done.stderr.strip()}")
                self.times[label].append(time.perf_counter() - began)


def start_large(
    url: str, sizes: list[int], run_steps: int | None, args: argparse.Namespace
) -> tuple[list[tuple[str, int, float]], dict[str, Any] | None]:
    """SQLite: `start()` of a background-started job of each size, each left to complete in
    turn; the one of `run_steps` steps is sampled and probed while it runs."""
    rows: list[tuple[str, int, float]] = []
    run: dict[str, Any] | None = None
    namespace = NAMESPACE  # the CLI's
    jobs = _connect(url, namespace, args.max_parallel_steps)
    try:
        jobs.wait(jobs.start(NoopFanOut, BenchRequest(steps=1)), interval=0.01)  # warm-up
        pids = host_pids(namespace)
        for steps in sizes:
            with MemorySampler(pids) as sampler:
                began = time.perf_counter()
                job_id = jobs.start(NoopFanOutInBackground, BenchRequest(steps=steps))
                started = time.perf_counter() - began
                rows.append(("sqlite", steps, started))
                print(f"start() sqlite {steps:,} steps: {started:.2f} s", flush=True)
                probes = Probes(jobs, job_id, ray.get_runtime_context().gcs_address, args.cli)
                while True:
                    try:
                        state = jobs.wait(job_id, timeout=args.probe_every)
                        break
                    except TimeoutError:
                        if steps == run_steps:
                            probes.once()
                seconds = time.perf_counter() - began
            if state is None or state.status != JobStatus.COMPLETED_SUCCESSFULLY:
                raise RuntimeError(f"the {steps}-step job ended {state.status if state else '-'}")
            print(f"run {steps:,} steps: {seconds:.1f} s", flush=True)
            print(f"phases: {_phases(state)}", flush=True)
            if steps == run_steps:
                run = {
                    "steps": steps,
                    "seconds": seconds,
                    "samples": sampler.samples,
                    "peaks": {role: sampler.peak(role) for role in pids},
                    "probes": probes.times,
                }
                print(f"peaks {run['peaks']}", flush=True)
    finally:
        stop_hosts(namespace)
    return rows, run


def _phases(state: Any) -> str:
    """Seconds from the job's creation to each status it went through, from its record."""
    created = state.created
    return ", ".join(
        f"{JobStatus(change.status).name} {(change.occurred - created).total_seconds():.1f}"
        for change in state.status_changes
    )


def start_postgres(admin_url: str, sizes: list[int], args: argparse.Namespace) -> list[Any]:
    """PostgreSQL: `start()` of each size, each in a database of its own (dropped after), its
    hosts stopped once `start()` returned (the steps are not run)."""
    rows = []
    for steps in sizes:
        url, drop = _postgres_database(admin_url)
        namespace = f"scale-postgres-{steps}"
        try:
            jobs = _connect(url, namespace, args.max_parallel_steps)
            try:
                jobs.wait(jobs.start(NoopFanOut, BenchRequest(steps=1)), interval=0.01)
                began = time.perf_counter()
                jobs.start(NoopFanOutInBackground, BenchRequest(steps=steps))
                started = time.perf_counter() - began
                rows.append(("postgres", steps, started))
                print(f"start() postgres {steps:,} steps: {started:.2f} s", flush=True)
            finally:
                stop_hosts(namespace)
        finally:
            drop()
    return rows


def concurrent_jobs(url: str, count: int, args: argparse.Namespace) -> dict[str, Any]:
    namespace = "scale-concurrent"
    jobs = _connect(url, namespace, args.max_parallel_steps)
    try:
        jobs.wait(jobs.start(NoopFanOut, BenchRequest(steps=1)), interval=0.01)
        pids = host_pids(namespace)
        with MemorySampler(pids) as sampler, ThreadPoolExecutor(8) as pool:
            began = time.perf_counter()
            ids = list(
                pool.map(lambda _: jobs.start(NoopFanOut, BenchRequest(steps=100)), range(count))
            )
            started = time.perf_counter() - began
            states = list(pool.map(lambda i: jobs.wait(i, interval=0.05), ids))
            seconds = time.perf_counter() - began
        completed = sum(
            1 for s in states if s is not None and s.status == JobStatus.COMPLETED_SUCCESSFULLY
        )
        return {
            "jobs": count,
            "completed": completed,
            "started": started,
            "seconds": seconds,
            "peaks": {role: sampler.peak(role) for role in pids},
        }
    finally:
        stop_hosts(namespace)


def start_latency(url: str, count: int, args: argparse.Namespace) -> dict[str, list[float]]:
    namespace = "scale-latency"
    jobs = _connect(url, namespace, args.max_parallel_steps)
    try:
        for _ in range(10):
            jobs.wait(jobs.start(NoopFanOut, BenchRequest(steps=1)), interval=0.001)
        starts, completions = [], []
        for _ in range(count):
            began = time.perf_counter()
            job_id = jobs.start(NoopFanOut, BenchRequest(steps=1))
            starts.append(time.perf_counter() - began)
            jobs.wait(job_id, interval=0.001)
            completions.append(time.perf_counter() - began)
        return {"start() returns a durable job": starts, "one-step job completes": completions}
    finally:
        stop_hosts(namespace)


def _postgres_database(admin_url: str) -> tuple[str, Any]:
    """A database of this run's own on the server of `admin_url`, and how to drop it."""
    import sqlalchemy as sa

    name = f"scale14_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    url = sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)

    def drop() -> None:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()

    return url, drop


def _plot(run: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for role in run["peaks"]:
        points = [(t, s[role]) for t, s in run["samples"] if role in s]
        ax.plot([t for t, _ in points], [v for _, v in points], label=f"{role} host")
    ax.axhline(500, color="C0", linestyle=":", label="controller target (500 MB)")
    ax.axhline(300, color="C1", linestyle=":", label="worker target (300 MB)")
    ax.set_xlabel("seconds since start()")
    ax.set_ylabel("resident memory (MB)")
    ax.set_title(f"One job of {run['steps']:,} no-op steps, SQLite, local Ray")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="100000", help="sizes whose start() is timed")
    parser.add_argument("--run-steps", type=int, default=0, help="the SQLite size to complete")
    parser.add_argument("--jobs", type=int, default=0, help="concurrent jobs of 100 steps")
    parser.add_argument("--latency", type=int, default=0, help="one-step jobs timed")
    parser.add_argument("--postgres", default=None, help="a PostgreSQL URL to also start on")
    parser.add_argument("--max-parallel-steps", type=int, default=None)
    parser.add_argument("--cli", action="store_true", help="time the CLI's show/list too")
    parser.add_argument("--probe-every", type=float, default=10.0)
    parser.add_argument("--postgres-only", action="store_true", help="skip the SQLite sizes")
    parser.add_argument("--plot", default=None, help="where the memory curve goes")
    args = parser.parse_args()
    sizes = [int(s) for s in args.steps.split(",") if s]
    ray.init(
        num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR", log_to_driver=False
    )
    started_rows: list[tuple[str, int, float]] = []
    run = concurrent = latency = None
    try:
        check_same_code()
        with tempfile.TemporaryDirectory() as tmp:
            sqlite = f"sqlite:///{Path(tmp) / 'jobs.db'}"
            if sizes and not args.postgres_only:
                rows, run = start_large(sqlite, sizes, args.run_steps, args)
                started_rows += rows
            if sizes and args.postgres:
                started_rows += start_postgres(args.postgres, sizes, args)
            if args.jobs:
                concurrent = concurrent_jobs(f"sqlite:///{Path(tmp) / 'many.db'}", args.jobs, args)
            if args.latency:
                latency = start_latency(f"sqlite:///{Path(tmp) / 'latency.db'}", args.latency, args)
    finally:
        ray.shutdown()
    load = os.getloadavg()
    print(f"\nLocal Ray, {os.cpu_count()} cores; load average at the end {load[0]:.1f}\n")
    if started_rows:
        print("| storage | steps | start() returns (s) |\n|---|---:|---:|")
        for storage, steps, seconds in started_rows:
            print(f"| {storage} | {steps:,} | {seconds:.2f} |")
    if run is not None:
        print(f"\n| run of {run['steps']:,} steps | |\n|---|---:|")
        print(f"| start() to completed | {run['seconds']:.1f} s |")
        print(f"| steps/s | {run['steps'] / run['seconds']:,.0f} |")
        for role, peak in run["peaks"].items():
            print(f"| {role} host peak RSS | {peak:,.0f} MB |")
        for label, times in run["probes"].items():
            if times:
                print(
                    f"| {label}: max / median over {len(times)} | "
                    f"{max(times):.2f} / {statistics.median(times):.2f} s |"
                )
        if args.plot:
            _plot(run, args.plot)
    if concurrent is not None:
        print(f"\n| {concurrent['jobs']:,} concurrent jobs of 100 steps | |\n|---|---:|")
        print(f"| completed | {concurrent['completed']:,} |")
        print(f"| all started after | {concurrent['started']:.1f} s |")
        print(f"| all completed after | {concurrent['seconds']:.1f} s |")
        print(f"| steps/s | {concurrent['jobs'] * 100 / concurrent['seconds']:,.0f} |")
        print(f"| jobs/s | {concurrent['jobs'] / concurrent['seconds']:,.1f} |")
        for role, peak in concurrent["peaks"].items():
            print(f"| {role} host peak RSS | {peak:,.0f} MB |")
    if latency is not None:
        print("\n| measure | p50 ms | p99 ms | mean ms |\n|---|---:|---:|---:|")
        for name, values in latency.items():
            print(
                f"| {name} | {_percentile(values, 0.5) * 1000:.1f} | "
                f"{_percentile(values, 0.99) * 1000:.1f} | {statistics.mean(values) * 1000:.1f} |"
            )


if __name__ == "__main__":
    main()
