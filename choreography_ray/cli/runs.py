"""Commands that run work on a local Ray of their own: `demo` and `bench`."""

from __future__ import annotations

import logging
import time
from typing import Annotated

import typer
from rich.table import Table

from ..jobs.state import JobState
from ..jobs.status import RUNNING_JOB_STATUSES, JobStatus
from ..storage import JobQuery
from ..storage.url import redact
from .common import (
    EXIT_INTERRUPTED,
    AddressOption,
    StorageOption,
    app,
    connect,
    console,
    guard,
    on_interrupt,
)


@app.command()
def demo(
    steps: Annotated[int, typer.Option(min=2, help="Steps of the demo job.")] = 2000,
    storage: StorageOption = None,
    address: AddressOption = None,
) -> None:
    """Run the demo: a two-stage fan-out with a live progress bar, on local Ray and SQLite.

    Interrupted with Ctrl-C and run again, it resumes the same job instead of starting over.

    Example: choreography demo --steps 200
    """
    from ..demo import DemoJob, DemoRequest
    from ..runtime.config import DEFAULT_STORAGE

    url = storage or DEFAULT_STORAGE
    began = time.monotonic()
    on_interrupt(
        f"interrupted while starting Ray: no demo job was started or changed; {redact(url)} "
        "is as it was"
    )
    # The hosts must know the demo's job types before they list or recover its jobs.
    jobs = guard(lambda: connect(url, address, modules=[DemoJob.__module__]))
    job_id = ""
    done_before = 0
    try:
        unfinished = guard(
            lambda: jobs.list(
                JobQuery(
                    type=DemoJob.name,
                    statuses=frozenset({*RUNNING_JOB_STATUSES, JobStatus.STOPPED}),
                    take=1,
                )
            )
        )
        if unfinished:
            job_id = unfinished[0].id
            done_before = unfinished[0].progress.done_steps
            console.print(f"resuming demo job {job_id}")
            if unfinished[0].status == JobStatus.STOPPED:
                guard(lambda: jobs.resume(job_id))
        else:
            console.print(f"starting a demo job of {steps} steps in two stages")
            job_id = guard(lambda: jobs.start(DemoJob, DemoRequest(steps=steps)))
            console.print(f"started demo job {job_id}")
        on_interrupt(_safe_line(f"job {job_id}", url))
        state = guard(lambda: jobs.wait(job_id, progress=console.is_terminal))
    except KeyboardInterrupt:
        console.print("\n" + _safe_line(f"job {job_id}" if job_id else "the demo job", url))
        raise typer.Exit(code=EXIT_INTERRUPTED) from None
    elapsed = time.monotonic() - began
    _summary(state, elapsed, done_before)
    _shutdown_local_ray()


def _safe_line(which: str, url: str) -> str:
    return (
        f"interrupted: {which} is safe in {redact(url)}; run `choreography demo` again to resume it"
    )


def _summary(state: JobState | None, elapsed: float, done_before: int = 0) -> None:
    """The outcome, and the rate of this run: steps done before it (a resumed job's) are not
    counted in it."""
    if state is None:
        console.print("the job finished and was cleared")
        return
    p = state.progress
    table = Table("outcome", "steps")
    table.add_row("succeeded", str(p.successful_steps))
    table.add_row("failed", str(p.failed_steps))
    table.add_row("unreachable", str(p.unreachable_steps))
    table.add_row("stopped", str(p.stopped_steps))
    table.add_row("total", str(p.total_steps))
    console.print(table)
    ran = p.done_steps - done_before
    rate = ran / elapsed if elapsed > 0 else 0.0
    earlier = f", {done_before} done before" if done_before else ""
    console.print(
        f"{state.status.name}: {ran} steps in {elapsed:.1f} s{earlier} "
        f"({rate:,.0f} steps/s this run, including Ray start-up)"
    )


def _shutdown_local_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


@app.command()
def bench(
    steps: Annotated[int, typer.Option(min=10, help="Steps of each fan-out job.")] = 1000,
    runs: Annotated[int, typer.Option(min=1, help="Runs; the table shows medians.")] = 3,
    tuned: Annotated[int, typer.Option(min=1, help="max_parallel_steps of the tuned hosts.")] = 256,
    workers_per_node: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Worker host processes per node of the tuned configuration; default: one "
            "per CPU, as the default configuration.",
        ),
    ] = None,
) -> None:
    """Benchmark a durable fan-out of no-op steps against plain Ray tasks, on a local Ray.

    Example: choreography bench --steps 1000 --runs 3
    """
    import tempfile

    import ray

    from .. import bench as fanout
    from ..runtime import connect as connect_hosts
    from ..runtime import stop_hosts

    table = Table("", "steps/s", "vs plain Ray", "p50 latency s", "p99 latency s")
    with tempfile.TemporaryDirectory() as workdir:
        ray.init(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
        try:
            fanout.check_same_code()  # run from another copy's checkout, it would measure that
            configs = {}
            for name, parallel, workers in (
                ("default", None, None),
                ("tuned", tuned, workers_per_node),
            ):
                url = f"sqlite:///{workdir}/{name}.db"
                configs[name] = (
                    connect_hosts(
                        url,
                        namespace=f"bench-{name}",
                        modules=[fanout.__name__],
                        max_parallel_steps=parallel,
                        workers_per_node=workers,
                    ),
                    url,
                )
            plain = [steps / fanout.plain_ray_tasks(steps) for _ in range(runs)]
            ray_rate = fanout.median(plain)
            table.add_row("plain Ray tasks", f"{ray_rate:,.0f}", "1.0x", "", "")
            for name, (jobs, url) in configs.items():
                results = [fanout.run_fanout(jobs, steps, url, name) for _ in range(runs)]
                middle = sorted(results, key=lambda r: r.rate)[len(results) // 2]
                label = f"choreography_ray {name}"
                table.add_row(
                    label,
                    f"{middle.rate:,.0f}",
                    f"{middle.rate / ray_rate:.1f}x",
                    f"{middle.percentile(0.5):.3f}",
                    f"{middle.percentile(0.99):.3f}",
                )
        finally:
            for name in ("default", "tuned"):
                stop_hosts(f"bench-{name}")
            ray.shutdown()
    plural = "s" if workers_per_node != 1 else ""
    hosts = f", {workers_per_node} worker host{plural} per node" if workers_per_node else ""
    console.print(f"fan-out of {steps} no-op steps, SQLite, medians of {runs} run(s) each")
    console.print(table)
    console.print(
        f"default: the default options; tuned: max_parallel_steps={tuned}{hosts}", soft_wrap=True
    )
