"""`choreography console`: the web console, over the cluster on this machine or a storage URL."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from .common import (
    AddressOption,
    StorageOption,
    app,
    console,
    error_line,
    errors,
    guard,
    no_cluster,
)

EXIT_USAGE = 2


@app.command("console")
def console_command(
    storage: StorageOption = None,
    address: AddressOption = None,
    host: Annotated[
        str, typer.Option(help="Interface to listen on; the default is this machine only.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8266,
    allow_actions: Annotated[
        bool,
        typer.Option(
            "--allow-actions", help="Offer stop, drain, resume and remove (needs a cluster)."
        ),
    ] = False,
    module: Annotated[
        list[str] | None,
        typer.Option(
            "--module", "-m", help="A module that defines job types (storage only; repeatable)."
        ),
    ] = None,
    refresh: Annotated[
        float, typer.Option(min=0, help="Seconds between live refreshes (0: off).")
    ] = 2.0,
) -> None:
    """Serve the web console: jobs, one job, its steps, and the cluster.

    It joins the cluster on this machine and reads the cluster's storage.

    With --storage alone, or --address none, it reads that storage (the demo's by default)
    and needs no Ray (read-only).

    Example: choreography console --allow-actions, then open http://127.0.0.1:8266
    """
    from ..console import ConsoleSettings, console_app, serve
    from ..console.app import LOOPBACK_NAMES
    from ..runtime.config import DEFAULT_STORAGE
    from ..storage.url import redact

    if (storage is not None and address is None) or no_cluster(address):
        if allow_actions:
            errors.print(
                error_line(
                    "--allow-actions needs a cluster: add --address (actions go through the "
                    "cluster's hosts, never straight to storage)"
                ),
                soft_wrap=True,
            )
            raise typer.Exit(EXIT_USAGE)
        url = storage or DEFAULT_STORAGE
        provider, source, extras = guard(lambda: _storage_only(url, module or []))
    else:
        provider, source, extras = guard(lambda: _on_cluster(storage, address or "auto"))
    settings = ConsoleSettings(
        allowed_hosts=LOOPBACK_NAMES if host in LOOPBACK_NAMES else None,
        allow_actions=allow_actions,
        refresh_seconds=refresh,
        bound=f"{host}:{port}",
        source=redact(source),
    )
    web_app = console_app(provider, settings=settings, **extras)
    mode = "actions on" if allow_actions else "read-only"

    def listening(where: str) -> None:
        console.print(f"console: {where} ({mode}); Ctrl-C stops it", highlight=False)

    try:
        guard(lambda: asyncio.run(serve(web_app, host, port, listening=listening)))
    except KeyboardInterrupt:
        console.print("console stopped")


def _storage_only(storage: str, modules: list[str]) -> tuple[Any, str, dict[str, Any]]:
    from ..jobs.errors import ConfigurationError
    from ..runtime.config import import_modules
    from ..storage import open_storage

    _, failed = import_modules(["choreography_ray.demo", *modules])
    if failed:
        raise ConfigurationError(f"cannot import job modules: {'; '.join(failed)}")
    return open_storage(storage), storage, {}


def _on_cluster(storage: str | None, address: str) -> tuple[Any, str, dict[str, Any]]:
    from ..console import ClientActions
    from ..console.ray_cluster import RayClusterView, cluster_storage
    from ..runtime import Jobs
    from ..runtime.connection import init_ray
    from ..runtime.constants import NAMESPACE

    init_ray(address, NAMESPACE)
    provider, config = cluster_storage(NAMESPACE, storage)
    extras = {"actions": ClientActions(Jobs(NAMESPACE)), "cluster": RayClusterView(NAMESPACE)}
    return provider, config.storage, extras
