"""Commands that read storage the way the console does: `jobs steps` and `status`.

They read the cluster's storage directly (the console's reader, see `reading`): listing steps
or counting jobs asks nothing of the controller hosts.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, TypeVar

import typer

from ..console.reader import StepListing
from ..jobs.state import DEFAULT_NAMESPACE, DEFAULT_SCOPE, JobKey
from ..storage.step_query import StepCursor, StepOrder, StepQuery
from .common import (
    NO_CLUSTER,
    AddressOption,
    ModuleOption,
    NamespaceOption,
    ScopeOption,
    StorageOption,
    app,
    console,
    guard,
    jobs_app,
    no_cluster,
)
from .output import (
    SHORT_ID,
    Column,
    Output,
    OutputOption,
    WideOption,
    lines,
    print_json,
    short_ids,
    step_json,
)
from .reading import ClusterReading, read_cluster

T = TypeVar("T")

STEP_COLUMNS = (
    Column("id", SHORT_ID),
    Column("status", 22),
    Column("attempt", 7, right=True),
    Column("stage", 5, right=True),
    Column("name", 16, shrinks=True),
    Column("error", 30, shrinks=True),
)


@jobs_app.command("steps")
def jobs_steps(
    job_id: str,
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
    status: Annotated[
        list[str] | None,
        typer.Option(
            help="Only steps in this status; 'failed' is every failure, 'prepared' a step "
            "never run (repeatable)."
        ),
    ] = None,
    stage: Annotated[int | None, typer.Option(help="Only steps of this stage.")] = None,
    step_type: Annotated[
        str | None, typer.Option("--type", help="Only steps of this step type.")
    ] = None,
    prefix: Annotated[str, typer.Option(help="Only steps whose id starts with this.")] = "",
    order: Annotated[
        StepOrder,
        typer.Option(help="plan: by stage and plan order; changed: the latest change first."),
    ] = StepOrder.PLAN,
    limit: Annotated[int, typer.Option(min=0, help="Steps per page (0: all).")] = 100,
    after: Annotated[
        str | None, typer.Option(help="Continue after this cursor, as a page's last line says.")
    ] = None,
    page: Annotated[int, typer.Option(min=0, help="Page, from 0 (--after is quicker).")] = 0,
    output: OutputOption = Output.table,
    wide: WideOption = False,
    module: ModuleOption = None,
) -> None:
    """List a job's steps: status, attempts and error, by stage and plan order.

    Example: choreography jobs steps 3f2a9c1e --status failed
    """
    from ..console.reader import parse_step_statuses, step_status_name
    from ..runtime.arguments import check_job_id, job_key

    key: JobKey = guard(lambda: job_key(scope, namespace))
    guard(lambda: check_job_id(job_id))

    def query() -> StepQuery:
        return StepQuery(
            statuses=parse_step_statuses(status or []),
            stage=stage,
            type=step_type,
            id_prefix=prefix,
            order=order,
            after=StepCursor.parse(after) if after else None,
            take=limit,
        )

    wanted = guard(query)

    async def work(reader: Any, _: ClusterReading) -> tuple[str, StepListing]:
        job = await reader.job(key, job_id)  # not found: exit 3; a prefix names one job
        asked = wanted
        for _skipped in range(page):  # pages before the one asked, each from the last's cursor
            listing = await reader.steps(key, job.id, asked)
            if listing.next is None:
                return job.id, StepListing([], listing.total, None)
            asked = asked.model_copy(update={"after": listing.next})
        return job.id, await reader.steps(key, job.id, asked)

    whole_id, found = read_cluster(storage, address, work, modules=module)
    following = found.next.token() if found.next is not None else None
    if output == Output.json:
        print_json(
            {
                "job_id": whole_id,
                "total": found.total,
                "page": page,
                "size": limit,
                "next": following,
                "steps": [step_json(s) for s in found.steps],
            }
        )
        return
    if not found.steps:
        console.print("no steps", highlight=False)
        return
    ids = {s.id: s.id for s in found.steps} if wide else short_ids(s.id for s in found.steps)
    rows = [
        [
            ids[s.id],
            step_status_name(s.status) + (" (waiting)" if s.waiting_for_key else ""),
            str(s.attempt),
            str(s.stage),
            s.name,
            "; ".join(s.error.messages)
            if s.error is not None
            else (s.waiting_for_key.text() if s.waiting_for_key else ""),
        ]
        for s in found.steps
    ]
    for line in lines(STEP_COLUMNS, rows, None if wide else console.width):
        console.print(line, highlight=False, soft_wrap=True)
    if following is not None:
        console.print(
            f"{len(found.steps)} of {found.total} steps; the next: --after {following}",
            highlight=False,
            soft_wrap=True,
        )


@app.command("status")
def status_command(
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
    output: OutputOption = Output.table,
    module: ModuleOption = None,
) -> None:
    """The cluster in one screen: nodes, roles, hosts, job modules, and jobs by status.

    With --address none there is no cluster: the jobs in --storage by status.

    Example: choreography status --output json
    """
    from ..console.ray_cluster import RayClusterView
    from ..runtime.arguments import job_key
    from ..runtime.constants import NAMESPACE
    from ..storage.url import redact

    key: JobKey = guard(lambda: job_key(scope, namespace))
    if no_cluster(address):
        _storage_status(storage, key, output, module)
        return

    async def work(reader: Any, cluster: ClusterReading) -> Any:
        snapshot = await RayClusterView(NAMESPACE).snapshot()
        return snapshot, await reader.status_counts(key), cluster.config

    snapshot, counts, config = read_cluster(storage, address, work, join=True, modules=module)
    if output == Output.json:
        print_json(
            {
                "namespace": snapshot.namespace,
                "storage": redact(config.storage),
                "modules": snapshot.modules,
                "job_types": snapshot.job_types,
                "nodes": [asdict(node) for node in snapshot.nodes],
                "jobs": {
                    "scope": key.scope,
                    "namespace": key.namespace,
                    "by_status": {s.name: n for s, n in sorted(counts.items())},
                },
            }
        )
        return
    say = console.print
    say(f"storage: {redact(config.storage)}", highlight=False, markup=False, soft_wrap=True)
    say(f"job modules: {', '.join(snapshot.modules) or '-'}", highlight=False, markup=False)
    for node in snapshot.nodes:
        roles = "+".join(
            r for r, on in (("controller", node.controller), ("worker", node.worker)) if on
        )
        say(
            f"node {node.node_id[:SHORT_ID]}  {node.hostname or node.address}  "
            f"{'alive' if node.alive else 'DEAD'}  {roles or 'no role'}  {node.cpus:g} CPUs",
            highlight=False,
            markup=False,
        )
        workers = [host.name for host in node.hosts if host.role == "worker"]
        for host in node.hosts:
            which = ""
            if host.role == "worker" and len(workers) > 1:  # one per CPU by default
                which = f" {workers.index(host.name) + 1} of {len(workers)}"
            figures = ""
            if host.active_runs is not None:
                figures = f"  {host.active_runs} running steps"
                if host.max_parallel_steps:
                    figures += f" of at most {host.max_parallel_steps}"
            problem = f"  ({host.problem})" if host.problem else ""
            say(f"  {host.role} host{which}{figures}{problem}", highlight=False, markup=False)
    by_status = ", ".join(f"{n} {s.name.lower()}" for s, n in sorted(counts.items()))
    say(f"jobs in {key}: {by_status or 'none'}", highlight=False, markup=False, soft_wrap=True)


def _storage_status(
    storage: str | None, key: JobKey, output: Output, modules: list[str] | None
) -> None:
    """`status --address none`: no nodes nor hosts to show, the jobs in storage by status."""
    from ..jobs.registry import default_registry
    from ..runtime.config import DEFAULT_STORAGE
    from ..storage.url import redact

    async def work(reader: Any, _: ClusterReading) -> Any:
        return await reader.status_counts(key)

    counts = read_cluster(storage, NO_CLUSTER, work, modules=modules)
    url = redact(storage or DEFAULT_STORAGE)
    by_status = {s.name: n for s, n in sorted(counts.items())}
    if output == Output.json:
        jobs = {"scope": key.scope, "namespace": key.namespace, "by_status": by_status}
        types = default_registry.names("job")
        print_json(
            {"namespace": None, "storage": url, "modules": modules or [], "job_types": types}
            | {"nodes": [], "jobs": jobs}
        )
        return
    say = console.print
    say(f"storage: {url}", highlight=False, markup=False, soft_wrap=True)
    say("no cluster (--address none): no nodes or hosts to show", highlight=False, markup=False)
    listed = ", ".join(f"{n} {name.lower()}" for name, n in by_status.items())
    say(f"jobs in {key}: {listed or 'none'}", highlight=False, markup=False, soft_wrap=True)
