"""Serving the console: the app over a storage provider, until interrupted.

The provider is opened and closed with the app, on the server's own event loop, because a
provider's connections belong to the loop that opened them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from ..storage.provider import StorageProvider
from .app import ConsoleSettings, create_app
from .ports import ClusterView, JobActions
from .reader import JobsReader

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8266
"""Next to Ray's dashboard (8265), which an operator often has open too."""


def console_app(
    provider: StorageProvider,
    *,
    settings: ConsoleSettings,
    actions: JobActions | None = None,
    cluster: ClusterView | None = None,
) -> web.Application:
    """The app over `provider`, which it initializes on start-up and closes on clean-up."""
    app = create_app(JobsReader(provider), settings=settings, actions=actions, cluster=cluster)

    async def opened(_: web.Application) -> None:
        await provider.initialize()

    async def closed(_: web.Application) -> None:
        await provider.close()

    app.on_startup.append(opened)
    app.on_cleanup.append(closed)
    return app


async def serve(
    app: web.Application,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    listening: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve `app` at host:port until `stop` is set (or the task is cancelled)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        if listening is not None:
            bound = runner.addresses[0] if runner.addresses else (host, port)
            listening(f"http://{_host(bound[0])}:{bound[1]}")
        await (stop or asyncio.Event()).wait()
    finally:
        await runner.cleanup()


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
