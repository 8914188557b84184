"""The `jobs` commands: list, show, watch, stop, drain, resume, retry-failed, remove and
rehydrate.

Ids, limits and statuses are checked before the command joins the cluster, so a mistake costs
no Ray start-up and reaches nothing stored.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from ..jobs.adaptive import window_lines
from ..jobs.errors import DrainJobResult
from ..jobs.state import DEFAULT_NAMESPACE, DEFAULT_SCOPE
from ..jobs.status import JobStatus
from ..storage import JobQuery
from .common import (
    EXIT_FAILED,
    AddressOption,
    ModuleOption,
    NamespaceOption,
    ScopeOption,
    StorageOption,
    connect,
    console,
    guard,
    jobs_app,
    no_cluster,
    on_interrupt,
)
from .listing import SINCE_HELP, SORT_HELP, changed_since, job_sort
from .output import (
    Output,
    OutputOption,
    WideOption,
    history_lines,
    job_detail_json,
    partition_options,
    print_json,
    quarantine_lines,
    show_jobs,
    waiting_text,
)
from .reading import ClusterReading, read_cluster, watch_in_storage

if TYPE_CHECKING:
    from ..runtime.client import Jobs


def _client(
    storage: str | None, address: str | None, scope: str, namespace: str, job_id: str | None
) -> Jobs:
    """The Jobs client, once the partition and the job id are known to be usable."""
    from ..runtime.arguments import check_job_id, job_key

    def checked() -> Jobs:
        job_key(scope, namespace)
        if job_id is not None:
            check_job_id(job_id)
        on_interrupt("interrupted while reaching the cluster: nothing was asked of it")
        return connect(storage, address)

    return guard(checked)


def _job_of(jobs: Jobs, given: str, scope: str, namespace: str, action: str) -> str:
    """The whole id of the job `given` names: itself, or the one job whose id it starts."""
    from ..console.reader import MATCHES_SHOWN, chosen_id

    def resolved() -> str:
        if jobs.find(given, scope=scope, namespace=namespace) is not None:
            return given
        query = JobQuery(id_prefix=given, take=MATCHES_SHOWN + 1)
        return chosen_id(given, [j.id for j in jobs.list(query, scope=scope, namespace=namespace)])

    job_id = guard(resolved)
    on_interrupt(
        f"interrupted: the {action} of job {job_id} may or may not have reached the cluster; "
        f"the job is safe in storage, and `choreography jobs show {job_id}"
        f"{partition_options(scope, namespace)}` says where it stands"
    )
    return job_id


@jobs_app.command("list")
def jobs_list(
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
    status: Annotated[list[str] | None, typer.Option(help="Only jobs in this status.")] = None,
    job_type: Annotated[str | None, typer.Option("--type", help="Only jobs of this type.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (0: all).")] = 100,
    changed: Annotated[str | None, typer.Option("--changed-since", help=SINCE_HELP)] = None,
    sort: Annotated[str, typer.Option("--sort", help=SORT_HELP)] = "created",
    output: OutputOption = Output.table,
    wide: WideOption = False,
    module: ModuleOption = None,
) -> None:
    """List jobs, oldest first unless --sort says otherwise, one line each.

    Example: choreography jobs list --changed-since 1h --sort=-changed
    """
    from ..runtime.arguments import check_query, job_key

    statuses = frozenset(guard(lambda: [_status(s) for s in status or []]))
    order, descending = guard(lambda: job_sort(sort))
    after = guard(lambda: changed_since(changed, datetime.now(UTC)) if changed else None)
    query = guard(
        lambda: check_query(
            JobQuery(
                type=job_type,
                statuses=statuses,
                changed_after=after,
                order=order,
                descending=descending,
                take=limit,
            )
        )
    )
    key = guard(lambda: job_key(scope, namespace))

    async def work(reader: Any, _: ClusterReading) -> list[Any]:
        return await reader.provider.for_key(key).jobs.query(query)

    show_jobs(read_cluster(storage, address, work, modules=module), output=output, wide=wide)


def _status(name: str) -> JobStatus:
    from ..console.reader import parse_status

    return parse_status(name, JobStatus)


@jobs_app.command("show")
def jobs_show(
    job_id: str,
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
    output: OutputOption = Output.table,
    verify: Annotated[
        bool | None,
        typer.Option(
            "--verify/--no-verify",
            help="Read every step record to count the unreadable ones (the default for a job "
            "that is not running), or count by the status stored beside each (the default "
            "while it runs: a million records read take tens of seconds).",
        ),
    ] = None,
    module: ModuleOption = None,
) -> None:
    """Show one job: status, progress per stage, its step records and its status history.

    Example: choreography jobs show 3f2a9c1e --output json
    """
    from ..console.reader import reads_every_step, stage_state
    from ..placement.capability import import_failures
    from ..runtime.arguments import check_job_id, job_key

    key = guard(lambda: job_key(scope, namespace))
    guard(lambda: check_job_id(job_id))

    async def work(reader: Any, cluster: ClusterReading) -> tuple[Any, Any, Any]:
        job = await reader.job(key, job_id)  # not found: exit 3
        thorough = verify if verify is not None else reads_every_step(job)
        counts = await reader.step_counts(key, job.id, verify=thorough)
        return job, counts, cluster.adverts()

    job, counts, adverts = read_cluster(storage, address, work, modules=module)
    if output == Output.json:
        print_json(job_detail_json(job, counts))
        return
    p = job.progress
    console.print(Text.assemble((job.id, "bold"), f"  {job.type}  {job.status.name}"))
    console.print(f"priority: {job.priority}")
    for line in window_lines(job):
        console.print(line)
    if job.details:
        console.print(job.details)
    for line in quarantine_lines(job):
        console.print(line, style="red", soft_wrap=True)
    if job.recovery_attempts and job.quarantine is None:
        error = f"; the last failed: {job.recovery_error}" if job.recovery_error else ""
        console.print(
            f"recovery attempts in a row not completed: {job.recovery_attempts}{error}",
            soft_wrap=True,
        )
    if job.waiting_for_worker is not None:
        since = f"{job.waiting_for_worker.since:%Y-%m-%d %H:%M:%S}"
        console.print(
            Text.assemble((waiting_text(job), "yellow"), f" (since {since})"), soft_wrap=True
        )
    from ..console.reader import key_wait

    keyed = key_wait(job)
    if keyed is not None:
        since = f"{keyed.since:%Y-%m-%d %H:%M:%S}"
        console.print(Text.assemble((keyed.text(), "yellow"), f" (since {since})"), soft_wrap=True)
    elif job.concurrency_key is not None:
        console.print(f"concurrency key: {job.concurrency_key}", soft_wrap=True)
    console.print(
        f"steps: {p.total_steps} total, {p.successful_steps} succeeded, {p.failed_steps} failed, "
        f"{p.unreachable_steps} unreachable, {p.stopped_steps} stopped"
    )
    stored = ", ".join(f"{n} {status.name.lower()}" for status, n in sorted(counts.items()))
    how = "" if counts.verified else " by stored status; --verify reads each record"
    console.print(
        f"step records: {counts.total} stored" + (f" ({stored})" if stored else "") + how,
        soft_wrap=True,
    )
    if counts.unreadable:
        why = (
            " here: name the module of their types with --module (or they are damaged)"
            if no_cluster(address)  # this process knows only the types it was told of
            else ": the job will not resume until they are fixed, or it is removed (resume "
            "names them)"
        )
        console.print(
            Text.assemble((f"{counts.unreadable} step record(s) cannot be read", "red"), why),
            soft_wrap=True,
        )
    for stage in p.stages:
        console.print(
            f"  stage {stage.stage}: {stage_state(stage)}, "
            f"{stage.successful_steps}/{stage.total_steps} succeeded, {stage.failed_steps} failed"
        )
    for line in history_lines(job):
        console.print(line, highlight=False, soft_wrap=True)
    cannot = import_failures(a for a in adverts.values() if not a.hosts(job.type))
    for failure in cannot:
        console.print(f"cannot run {job.type} on {failure}", style="yellow", soft_wrap=True)
    for failure in import_failures(adverts.values()):
        if failure not in cannot:  # a host that runs the job type but not every step type
            console.print(
                f"import failed on {failure}: steps of its types go elsewhere",
                style="yellow",
                soft_wrap=True,
            )


@jobs_app.command("watch")
def jobs_watch(
    job_id: str,
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds.")] = None,
    module: ModuleOption = None,
) -> None:
    """Follow a job's progress until it finishes; exit 1 unless it completed successfully.

    With --address none it follows the job in --storage, read every half second.

    Example: choreography jobs watch 3f2a9c1e --timeout 600 && echo done
    """
    from ..runtime.arguments import check_job_id, job_key

    if no_cluster(address):
        key = guard(lambda: job_key(scope, namespace))
        guard(lambda: check_job_id(job_id))
        on_interrupt(f"stopped watching: job {job_id} is as it was")
        state = watch_in_storage(storage, key, job_id, timeout, module)
    else:
        jobs = _client(storage, address, scope, namespace, job_id)
        whole = _job_of(jobs, job_id, scope, namespace, "watch")
        on_interrupt(f"stopped watching: job {whole} goes on running, unchanged")
        state = guard(
            lambda: jobs.wait(
                whole, timeout=timeout, progress=True, scope=scope, namespace=namespace
            )
        )
    console.print(state.status.name if state is not None else "finished and cleared")
    if state is not None and state.status != JobStatus.COMPLETED_SUCCESSFULLY:
        raise typer.Exit(EXIT_FAILED)


def _simple(action: str, call: Callable[[Jobs, str, str, str], object]) -> Callable[..., None]:
    def command(
        job_id: str,
        storage: StorageOption = None,
        address: AddressOption = "auto",
        scope: ScopeOption = DEFAULT_SCOPE,
        namespace: NamespaceOption = DEFAULT_NAMESPACE,
    ) -> None:
        jobs = _client(storage, address, scope, namespace, job_id)
        whole = _job_of(jobs, job_id, scope, namespace, action)
        answer = guard(lambda: call(jobs, whole, scope, namespace))
        suffix = f": {answer.name}" if answer is not None and hasattr(answer, "name") else ""
        console.print(f"{action}: {whole}{suffix}", highlight=False)

    command.__doc__ = {
        "stop": "Stop a job; it can be resumed.",
        "resume": "Resume a stopped or interrupted job.",
        "remove": "Stop a job and delete it with its steps.",
    }[action] + f"\n\nExample: choreography jobs {action} 3f2a9c1e --scope studio"
    return command


jobs_app.command("stop")(
    _simple("stop", lambda jobs, job_id, scope, ns: jobs.stop(job_id, scope=scope, namespace=ns))
)
jobs_app.command("resume")(
    _simple("resume", lambda jobs, job, scope, ns: jobs.resume(job, scope=scope, namespace=ns))
)
jobs_app.command("remove")(
    _simple("remove", lambda jobs, job, scope, ns: jobs.remove(job, scope=scope, namespace=ns))
)


@jobs_app.command("retry-failed")
def jobs_retry_failed(
    job_id: str,
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
    steps: Annotated[
        list[str] | None,
        typer.Option(
            "--steps",
            help="Only these failed steps (ids; repeat the option or separate with commas).",
        ),
    ] = None,
) -> None:
    """Run the failed steps of a job that completed with failures (or was stopped) again,
    under their ids; its successes stay as they are.

    Example: choreography jobs retry-failed 3f2a9c1e5d7b4a60 --steps 9b1c,77de
    """
    from ..runtime.arguments import check_step_ids

    named = None
    if steps is not None:
        split = [part.strip() for value in steps for part in value.split(",") if part.strip()]
        named = guard(lambda: check_step_ids(split))
    jobs = _client(storage, address, scope, namespace, job_id)
    whole = _job_of(jobs, job_id, scope, namespace, "retry-failed")
    rerun = guard(lambda: jobs.retry_failed(whole, steps=named, scope=scope, namespace=namespace))
    console.print(f"retry-failed: {whole}: {len(rerun)} failed step(s) run again")
    for step_id in rerun:
        console.print(f"  {step_id}")


@jobs_app.command("set-priority")
def jobs_set_priority(
    job_id: str,
    priority: Annotated[int, typer.Argument(help="Higher goes first; may be negative.")],
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
) -> None:
    """Change a job's priority: stored with it, and its queued steps wait by it from now on.

    Example: choreography jobs set-priority 3f2a9c1e5d7b4a60 10
    """
    from ..engine.priority import check_priority

    guard(lambda: check_priority(priority))
    jobs = _client(storage, address, scope, namespace, job_id)
    whole = _job_of(jobs, job_id, scope, namespace, "set-priority")
    guard(lambda: jobs.set_priority(whole, priority, scope=scope, namespace=namespace))
    console.print(f"set-priority: {whole}: {priority}")


@jobs_app.command("drain")
def jobs_drain(
    job_id: str,
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
    timeout: Annotated[
        float, typer.Option(help="Wait at most this many seconds for every step to stop.")
    ] = 30.0,
) -> None:
    """Stop a job and wait until every step has stopped and stored its outcome.

    Example: choreography jobs drain 3f2a9c1e --timeout 120
    """
    from ..recovery.explicit import check_timeout

    guard(lambda: check_timeout(timeout))  # before joining the cluster
    jobs = _client(storage, address, scope, namespace, job_id)
    whole = _job_of(jobs, job_id, scope, namespace, "drain")
    outcome = guard(lambda: jobs.drain(whole, timeout=timeout, scope=scope, namespace=namespace))
    console.print(f"drain: {whole}: {outcome.result.name}", highlight=False)
    console.print(f"  drained: {', '.join(outcome.drained) or 'none'}")
    if outcome.not_drained:
        console.print(f"  not drained (still stopping): {', '.join(outcome.not_drained)}")
    if outcome.result == DrainJobResult.NOT_FOUND:
        raise typer.Exit(3)  # no job has that id, as for every other command
    if outcome.result not in (DrainJobResult.DRAINED, DrainJobResult.COMPLETED):
        raise typer.Exit(1)  # timed out: a script must not go on


@jobs_app.command("rehydrate")
def jobs_rehydrate(
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
    timeout: Annotated[
        float, typer.Option(help="Wait at most this many seconds for the jobs to resume.")
    ] = 60.0,
) -> None:
    """Resume a partition's interrupted jobs now, as after a restart, and say what was done.

    Example: choreography jobs rehydrate --scope studio --namespace tenant-a
    """
    from ..recovery.explicit import check_timeout

    guard(lambda: check_timeout(timeout))  # before joining the cluster
    jobs = _client(storage, address, scope, namespace, None)
    summary = guard(lambda: jobs.rehydrate(timeout=timeout, scope=scope, namespace=namespace))
    console.print(summary.line())
