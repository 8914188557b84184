"""The `choreography` command.

Errors the user can act on (an unreachable cluster or store, an unknown job id, a bad option)
are printed as one line and end the command with exit code 1; `--debug` (or CHOREOGRAPHY_DEBUG)
shows the traceback instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from .jobs.errors import ChoreographyError
from .jobs.options import JobsOptions
from .jobs.state import DEFAULT_NAMESPACE, DEFAULT_SCOPE, JobState
from .jobs.status import RUNNING_JOB_STATUSES, JobStatus
from .storage import JobQuery, open_storage
from .storage.url import redact

STORAGE_ENV = "CHOREOGRAPHY_STORAGE"
ADDRESS_ENV = "CHOREOGRAPHY_ADDRESS"
CONFIG_ENV = "CHOREOGRAPHY_CONFIG"
DEFAULT_STORAGE = "sqlite:///.choreography/jobs.db"

T = TypeVar("T")

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Durable jobs on Ray.")
storage_app = typer.Typer(no_args_is_help=True, help="Inspect and prepare job storage.")
jobs_app = typer.Typer(no_args_is_help=True, help="List, watch, stop, resume and remove jobs.")
app.add_typer(storage_app, name="storage")
app.add_typer(jobs_app, name="jobs")

console = Console()
errors = Console(stderr=True)
_debug = bool(os.environ.get("CHOREOGRAPHY_DEBUG"))

StorageOption = Annotated[
    str | None,
    typer.Option(
        "--storage",
        envvar=STORAGE_ENV,
        help="Storage URL (sqlite:///…, postgresql+psycopg://…, mongodb://…).",
    ),
]
AddressOption = Annotated[
    str | None,
    typer.Option(
        "--address",
        envvar=ADDRESS_ENV,
        help="Ray cluster: 'auto' (this machine), 'ray://host:10001', or none for a local Ray.",
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", envvar=CONFIG_ENV, help="TOML file with a [jobs] table of options."),
]
ScopeOption = Annotated[str, typer.Option("--scope", help="Storage scope of the jobs.")]
NamespaceOption = Annotated[str, typer.Option("--namespace", help="Namespace of the jobs.")]


@app.callback()
def _main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False) -> None:
    global _debug
    _debug = _debug or debug


def _fail(error: BaseException) -> typer.Exit:
    message = str(error) or type(error).__name__
    errors.print(f"[red]error:[/red] {redact(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=1)


def _guard(fn: Callable[[], T]) -> T:
    """Run a command's work; turn expected errors into one line and exit code 1."""
    try:
        return fn()
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        raise
    except (ChoreographyError, ConnectionError, TimeoutError, ValueError, OSError) as error:
        if _debug:
            raise
        raise _fail(error) from None


# -- options and storage -----------------------------------------------------------------------


@app.command()
def options(config: ConfigOption = None) -> None:
    """Show the effective job options: defaults, then the file, then CHOREOGRAPHY_* variables."""
    loaded = _guard(lambda: JobsOptions.load(config))
    table = Table("setting", "value", "source")
    env_values = JobsOptions.from_env()
    file_values = JobsOptions.from_toml(config) if config else {}
    for name in JobsOptions.model_fields:
        source = (
            "environment" if name in env_values else "file" if name in file_values else "default"
        )
        table.add_row(name, str(getattr(loaded, name)), source)
    console.print(table)


@storage_app.command("check")
def storage_check(
    storage: StorageOption = None,
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
) -> None:
    """Open the store, create its schema if needed, and count the jobs of one partition."""
    url = storage or DEFAULT_STORAGE

    async def check() -> int:
        provider = open_storage(url)
        try:
            await provider.initialize()
            return await provider.for_key(scope=scope, namespace=namespace).jobs.count(JobQuery())
        finally:
            await provider.close()

    count = _guard(lambda: asyncio.run(check()))
    console.print(f"{redact(url)}: reachable, {count} job(s) in {scope}/{namespace}")


# -- the cluster ---------------------------------------------------------------------------------


def _connect(
    storage: str | None, address: str | None, config: Path | None = None, **kwargs: Any
) -> Any:
    from .runtime import connect

    # Options come from the file and from CHOREOGRAPHY_* variables; none given, none sent.
    options = JobsOptions.load(config)
    given = options if options.model_fields_set else None
    return connect(storage, address=address, options=given, **kwargs)


@app.command()
def up(
    storage: StorageOption = None,
    address: AddressOption = "auto",
    config: ConfigOption = None,
    module: Annotated[
        list[str] | None,
        typer.Option("--module", "-m", help="A module that defines job types (repeatable)."),
    ] = None,
    workers_per_node: Annotated[
        int, typer.Option(min=1, help="Worker host processes per worker node (cores to use).")
    ] = 1,
) -> None:
    """Start the host actors on a running Ray cluster, with its storage and options."""

    def start() -> list[str]:
        import ray

        from .runtime.constants import NAMESPACE

        _connect(storage, address, config, modules=module or [], workers_per_node=workers_per_node)
        names = [
            e["name"]
            for e in ray.util.list_named_actors(all_namespaces=True)
            if e.get("namespace") == NAMESPACE and e.get("name", "").startswith("choreography:")
        ]
        return sorted(names)

    for name in _guard(start):
        console.print(f"running: {name}")


@app.command()
def down(address: AddressOption = "auto") -> None:
    """Stop the host actors of a cluster; jobs stay in storage and resume on the next `up`."""

    def stop() -> list[str]:
        import ray

        from .runtime import stop_hosts
        from .runtime.constants import NAMESPACE

        if not ray.is_initialized():
            ray.init(address=address, namespace=NAMESPACE, logging_level="WARNING")
        return stop_hosts(NAMESPACE)

    for name in _guard(stop):
        console.print(f"stopped: {name}")


# -- the demo ----------------------------------------------------------------------------------


@app.command()
def demo(
    steps: Annotated[int, typer.Option(min=2, help="Steps of the demo job.")] = 2000,
    storage: StorageOption = None,
    address: AddressOption = None,
) -> None:
    """Run the demo: a two-stage fan-out with a live progress bar, on local Ray and SQLite.

    Interrupted with Ctrl-C and run again, it resumes the same job instead of starting over.
    """
    from .demo import DemoJob, DemoRequest

    url = storage or DEFAULT_STORAGE
    began = time.monotonic()
    # The hosts must know the demo's job types before they list or recover its jobs.
    jobs = _guard(lambda: _connect(url, address, modules=[DemoJob.__module__]))
    job_id = ""
    try:
        unfinished = _guard(
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
            console.print(f"resuming demo job {job_id}")
            if unfinished[0].status == JobStatus.STOPPED:
                _guard(lambda: jobs.resume(job_id))
        else:
            console.print(f"starting a demo job of {steps} steps in two stages")
            job_id = _guard(lambda: jobs.start(DemoJob, DemoRequest(steps=steps)))
            console.print(f"started demo job {job_id}")
        state = _guard(lambda: jobs.wait(job_id, progress=console.is_terminal))
    except KeyboardInterrupt:
        which = f"job {job_id}" if job_id else "the demo job"
        console.print(
            f"\ninterrupted: {which} is safe in {redact(url)}; run `choreography demo` "
            "again to resume it"
        )
        raise typer.Exit(code=130) from None
    elapsed = time.monotonic() - began
    _summary(state, elapsed)
    _shutdown_local_ray()


def _summary(state: JobState | None, elapsed: float) -> None:
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
    rate = p.total_steps / elapsed if elapsed > 0 else 0.0
    console.print(
        f"{state.status.name}: {p.total_steps} steps in {elapsed:.1f} s "
        f"({rate:,.0f} steps/s, including Ray start-up)"
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
        int, typer.Option(min=1, help="Worker host processes of the tuned configuration.")
    ] = 1,
) -> None:
    """Benchmark a durable fan-out of no-op steps against plain Ray tasks, on a local Ray."""
    import tempfile

    import ray

    from . import bench as fanout
    from .runtime import connect, stop_hosts

    table = Table("", "steps/s", "vs plain Ray", "p50 latency s", "p99 latency s")
    with tempfile.TemporaryDirectory() as workdir:
        ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        try:
            configs = {}
            for name, parallel, workers in (
                ("default", None, 1),
                ("tuned", tuned, workers_per_node),
            ):
                url = f"sqlite:///{workdir}/{name}.db"
                configs[name] = (
                    connect(
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
    hosts = f", {workers_per_node} worker hosts per node" if workers_per_node > 1 else ""
    console.print(f"fan-out of {steps} no-op steps, SQLite, medians of {runs} run(s) each")
    console.print(table)
    console.print(
        f"default: the default options; tuned: max_parallel_steps={tuned}{hosts}", soft_wrap=True
    )


# -- jobs ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _jobs(storage: str | None, address: str | None) -> Iterator[Any]:
    jobs = _guard(lambda: _connect(storage, address))
    yield jobs


def _key_args(scope: str, namespace: str) -> dict[str, str]:
    return {"scope": scope, "namespace": namespace}


@jobs_app.command("list")
def jobs_list(
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
    status: Annotated[list[str] | None, typer.Option(help="Only jobs in this status.")] = None,
    job_type: Annotated[str | None, typer.Option("--type", help="Only jobs of this type.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (0: all).")] = 100,
) -> None:
    """List jobs, oldest first."""
    statuses = frozenset(_guard(lambda: [_status(s) for s in status or []]))
    query = JobQuery(type=job_type, statuses=statuses, take=limit)
    with _jobs(storage, address) as jobs:
        found = _guard(lambda: jobs.list(query, **_key_args(scope, namespace)))
    table = Table()
    table.add_column("id", no_wrap=True, min_width=max((len(j.id) for j in found), default=2))
    table.add_column("type", overflow="fold")
    table.add_column("status", no_wrap=True)
    for column in ("progress", "created", "details"):
        table.add_column(column)
    for job in found:
        p = job.progress
        table.add_row(
            job.id,
            job.type,
            job.status.name,
            f"{p.successful_steps + p.failed_steps + p.unreachable_steps}/{p.total_steps}",
            job.created.strftime("%Y-%m-%d %H:%M:%S"),
            job.details,
        )
    console.print(table)


def _status(name: str) -> JobStatus:
    try:
        return JobStatus[name.strip().upper().replace("-", "_")]
    except KeyError:
        raise ValueError(
            f"unknown status {name!r}; one of: {', '.join(s.name.lower() for s in JobStatus)}"
        ) from None


@jobs_app.command("show")
def jobs_show(
    job_id: str,
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
) -> None:
    """Show one job: status, progress per stage, and its status history."""
    with _jobs(storage, address) as jobs:
        job = _guard(lambda: jobs.get(job_id, **_key_args(scope, namespace)))
    p = job.progress
    console.print(f"[bold]{job.id}[/bold]  {job.type}  {job.status.name}")
    if job.details:
        console.print(job.details)
    console.print(
        f"steps: {p.total_steps} total, {p.successful_steps} succeeded, {p.failed_steps} failed, "
        f"{p.unreachable_steps} unreachable, {p.stopped_steps} stopped"
    )
    for stage in p.stages:
        console.print(
            f"  stage {stage.stage}: {'started' if stage.is_started else 'not started'}, "
            f"{stage.successful_steps}/{stage.total_steps} succeeded, {stage.failed_steps} failed"
        )
    for change in job.status_changes:
        why = f"  {'; '.join(change.exception_messages)}" if change.exception_messages else ""
        console.print(
            f"  {change.occurred:%Y-%m-%d %H:%M:%S}  {JobStatus(change.status).name}{why}"
        )


@jobs_app.command("watch")
def jobs_watch(
    job_id: str,
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds.")] = None,
) -> None:
    """Follow a job's progress until it finishes."""
    with _jobs(storage, address) as jobs:
        state = _guard(
            lambda: jobs.wait(job_id, timeout=timeout, progress=True, **_key_args(scope, namespace))
        )
    console.print(state.status.name if state is not None else "finished and cleared")


def _simple(action: str) -> Callable[..., None]:
    def command(
        job_id: str,
        storage: StorageOption = None,
        address: AddressOption = "auto",
        scope: ScopeOption = DEFAULT_SCOPE,
        namespace: NamespaceOption = DEFAULT_NAMESPACE,
    ) -> None:
        with _jobs(storage, address) as jobs:
            answer = _guard(lambda: getattr(jobs, action)(job_id, **_key_args(scope, namespace)))
        suffix = f": {answer.name}" if answer is not None and hasattr(answer, "name") else ""
        console.print(f"{action}: {job_id}{suffix}")

    command.__doc__ = {
        "stop": "Stop a job; it can be resumed.",
        "resume": "Resume a stopped or interrupted job.",
        "remove": "Stop a job and delete it with its steps.",
    }[action]
    return command


for _action in ("stop", "resume", "remove"):
    jobs_app.command(_action)(_simple(_action))


def main() -> None:
    app()


__all__ = ["app", "main"]


if __name__ == "__main__":
    main()
