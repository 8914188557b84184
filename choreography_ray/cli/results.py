"""`jobs results`: a map's results in item order, read from the cluster's storage.

Like `jobs steps`, it reads storage directly (see `reading`) and asks nothing of the
controller hosts. Results are printed as stored, JSON: no type needs importing here.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import typer

from ..jobs.state import DEFAULT_NAMESPACE, DEFAULT_SCOPE, JobKey
from ..jobs.status import JobStepStatus
from .common import (
    AddressOption,
    ModuleOption,
    NamespaceOption,
    ScopeOption,
    StorageOption,
    guard,
    jobs_app,
)
from .output import Output, OutputOption
from .reading import ClusterReading, read_cluster

if TYPE_CHECKING:
    from ..engine.results import StoredItem

POLL_SECONDS = 0.5
"""How often an item still running is read again."""


def item_json(item: StoredItem) -> dict[str, Any]:
    """One item's outcome (`StoredItem`) for scripts (schema: docs/running.md)."""
    error = None
    if item.status != JobStepStatus.COMPLETED_SUCCESSFULLY:
        failure = item.failure()
        error = {"type": failure.error_type, "messages": failure.messages}
    return {
        "index": item.index,
        "status": item.status.name,
        "result": item.result.data if item.result is not None and error is None else None,
        "error": error,
    }


def item_line(item: StoredItem) -> str:
    """One item's outcome for people: index, status, then its result or its error."""
    shown = item_json(item)
    error = shown["error"]
    what = "; ".join(error["messages"]) if error else json.dumps(shown["result"])
    return f"{item.index:>8}  {item.status.name:<22}  {what}"


@jobs_app.command("results")
def jobs_results(
    job_id: str,
    storage: StorageOption = None,
    address: AddressOption = "auto",
    scope: ScopeOption = DEFAULT_SCOPE,
    namespace: NamespaceOption = DEFAULT_NAMESPACE,
    output: OutputOption = Output.table,
    module: ModuleOption = None,
) -> None:
    """Print a map's results in item order, each item's result or its error, a page at a
    time; an item still running is waited for (Ctrl-C stops).

    Example: choreography jobs results 3f2a9c1e5d7b4a60 --output json > results.json
    """
    from ..engine.results import ResultSource, in_item_order
    from ..runtime.arguments import check_job_id, job_key

    key: JobKey = guard(lambda: job_key(scope, namespace))
    guard(lambda: check_job_id(job_id))
    as_json = output == Output.json

    async def work(reader: Any, _: ClusterReading) -> None:
        async def pause() -> None:
            await asyncio.sleep(POLL_SECONDS)

        whole = (await reader.job(key, job_id)).id  # a unique prefix names its job
        steps = reader.provider.for_key(key).steps
        source = ResultSource.stored(steps, whole, lambda: reader.job(key, whole), pause)
        first = True
        async for item in in_item_order(source):
            if as_json:
                shown = json.dumps(item_json(item), ensure_ascii=False)
                typer.echo(("[\n  " if first else ",\n  ") + shown, nl=False)
            else:
                typer.echo(item_line(item))
            first = False
        if as_json:
            typer.echo("[]" if first else "\n]")

    read_cluster(storage, address, work, modules=module)
