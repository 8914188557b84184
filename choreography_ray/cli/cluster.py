"""Commands for the cluster and its storage: `up`, `down`, `options`, `storage check`."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.table import Table

from ..jobs.options import JobsOptions
from ..jobs.state import DEFAULT_NAMESPACE, DEFAULT_SCOPE
from ..storage.url import redact
from .common import (
    AddressOption,
    ConfigOption,
    NamespaceOption,
    ScopeOption,
    StorageOption,
    app,
    connect,
    console,
    guard,
    ray_address,
    storage_app,
)


@app.command()
def options(config: ConfigOption = None) -> None:
    """Show the effective job options: defaults, then the file, then CHOREOGRAPHY_* variables.

    Example: choreography options --config jobs.toml
    """
    loaded = guard(lambda: JobsOptions.load(config))
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
    """Open the store, create its schema if needed, and count the jobs of one partition.

    Example: choreography storage check --storage sqlite:///.choreography/jobs.db
    """
    from ..runtime.config import DEFAULT_STORAGE
    from ..storage import JobQuery, open_storage

    url = storage or DEFAULT_STORAGE

    async def check() -> int:
        provider = open_storage(url)
        try:
            await provider.initialize()
            return await provider.for_key(scope=scope, namespace=namespace).jobs.count(JobQuery())
        finally:
            await provider.close()

    count = guard(lambda: asyncio.run(check()))
    console.print(f"{redact(url)}: reachable, {count} job(s) in {scope}/{namespace}")


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
        int | None,
        typer.Option(
            help="Worker host processes per worker node (cores to use); default: one per CPU "
            "of each node, at most 8."
        ),
    ] = None,
) -> None:
    """Start the host actors on a running Ray cluster, with its storage and options.

    Example: choreography up --storage postgresql+psycopg://jobs@db:5432/jobs -m mypackage.jobs
    """

    def start() -> tuple[list[str], list[str]]:
        from ..runtime.constants import ACTOR_PREFIX, NAMESPACE
        from ..runtime.directory import actor_names

        jobs = connect(
            storage, address, config, modules=module or [], workers_per_node=workers_per_node
        )
        return actor_names(NAMESPACE, (ACTOR_PREFIX,)), jobs.import_failures()

    names, failures = guard(start)
    for name in names:
        console.print(f"running: {name}")
    for failure in failures:
        # That node runs none of the module's types; the others do.
        console.print(f"could not import on {failure}", style="yellow", soft_wrap=True)


@app.command()
def down(address: AddressOption = "auto") -> None:
    """Stop the host actors of a cluster; jobs stay in storage and resume on the next `up`.

    Example: choreography down --address 127.0.0.1:6379
    """

    def stop() -> list[str]:
        from ..runtime import stop_hosts
        from ..runtime.connection import init_ray
        from ..runtime.constants import NAMESPACE

        init_ray(ray_address(address), NAMESPACE)
        return stop_hosts(NAMESPACE)

    for name in guard(stop):
        console.print(f"stopped: {name}")
