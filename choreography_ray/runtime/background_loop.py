"""One event loop on a daemon thread, where the blocking client runs its coroutines.

`asyncio.run` per call would fail where a loop already runs (a notebook, an async driver that
calls the blocking client) and would make a loop per call; a thread per call is what the client
did before. One loop, started on first use, serves every blocking call of the process: the
caller's thread waits on the call's future, and Ray's object references resolve on that loop
as on any other.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """An event loop of its own, started on first use, that blocking callers run coroutines on."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                thread.start()
                self._loop = loop
            return self._loop

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        """`call`'s result, run to the end on the loop while this thread waits; interrupted
        (Ctrl-C), the call is cancelled rather than left running."""
        loop = self._running()
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            call.close()
            raise RuntimeError(
                "a blocking Jobs call from a coroutine on the client's own loop would wait on "
                "itself: await the same call on `jobs.aio` instead"
            )
        future = asyncio.run_coroutine_threadsafe(call, loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def iterate(self, items: AsyncGenerator[T, None]) -> Iterator[T]:
        """`items` one by one, each fetched on the loop; closed on the loop when the caller
        stops early."""
        try:
            while True:
                try:
                    item = self.run(_next(items))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            self.run(_closed(items))


async def _next(items: AsyncIterator[T]) -> T:
    return await items.__anext__()


async def _closed(items: AsyncGenerator[T, None]) -> None:
    await items.aclose()
