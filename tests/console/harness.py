"""An in-process cluster and the console over its storage, served from one event loop that
runs in a thread, so a browser (or any HTTP client) can use it while the test drives jobs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from choreography_ray.console import ConsoleSettings, JobsReader, ManagerActions, create_app
from choreography_ray.console.app import LOOPBACK_NAMES
from choreography_ray.console.server import serve
from choreography_ray.engine.clock import SystemClock
from choreography_ray.jobs import JobsOptions
from choreography_ray.testing import InProcessCluster

from ..engine import fixtures

T = TypeVar("T")

BOUND = 30.0
"""Seconds any call into the server's loop may take."""


class ConsoleHarness:
    """`with ConsoleHarness() as h:` serves the console at `h.url` over a fresh in-process
    cluster (`h.cluster`); `h.run(coro)` and `h.call(fn)` run on the server's loop."""

    def __init__(
        self, *, allow_actions: bool = True, refresh_seconds: float = 0.3, page_size: int = 50
    ) -> None:
        self.settings = ConsoleSettings(
            allow_actions=allow_actions,
            refresh_seconds=refresh_seconds,
            source="memory://",
            page_size=page_size,
            allowed_hosts=LOOPBACK_NAMES,
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.url = ""
        self.cluster: InProcessCluster
        self.app: Any = None
        self._stop: asyncio.Event
        self._served: Future[None]

    def __enter__(self) -> ConsoleHarness:
        fixtures.SCRIPT = fixtures.Script()
        self.thread.start()
        self.run(self._open())
        listening: Future[str] = Future()
        self._served = asyncio.run_coroutine_threadsafe(self._serve(listening), self.loop)
        self.url = listening.result(BOUND)
        return self

    async def _open(self) -> None:
        # The system clock: pages show real ages; the tests never wait for a timeout.
        self.cluster = InProcessCluster(
            options=JobsOptions(max_parallel_steps=8), clock=SystemClock()
        )
        await self.cluster.provider.initialize()
        self._stop = asyncio.Event()

    async def _serve(self, listening: Future[str]) -> None:
        self.app = app = create_app(
            JobsReader(self.cluster.provider),
            settings=self.settings,
            actions=ManagerActions(self.cluster),
        )
        await serve(app, "127.0.0.1", 0, listening=listening.set_result, stop=self._stop)

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self._stop.set)
            self._served.result(BOUND)
            self.run(self.cluster.close())
            self.run(_cancel_the_rest())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(BOUND)
            self.loop.close()
            fixtures.SCRIPT = fixtures.Script()

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(_awaited(coro), self.loop).result(BOUND)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        async def called() -> T:
            return fn(*args)

        return self.run(called())


async def _awaited(coro: Awaitable[T]) -> T:
    return await coro


async def _cancel_the_rest() -> None:
    """End what the cluster left running (watchdogs), so the loop closes clean."""
    current = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not current]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
