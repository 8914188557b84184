"""Blocking storage calls on a provider's own threads.

What `loop.run_in_executor` does, without the concurrent future it chains to the loop's own:
a call costs one queue put and one `call_soon_threadsafe`, which is most of what a single-row
write costs. The event loop of a host never blocks on a driver.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from contextlib import suppress
from queue import SimpleQueue
from typing import Any, TypeVar

log = logging.getLogger("choreography_ray.storage")

T = TypeVar("T")


class BlockingCalls:
    """Threads that run blocking calls for event loops.

    What `loop.run_in_executor` does, without the concurrent future it chains to the loop's:
    a call costs one queue put and one `call_soon_threadsafe`. Calls start in submission order;
    `shutdown` lets the queued ones finish. Threads start with the first call.
    """

    def __init__(
        self,
        threads: int,
        name: str,
        after: Callable[[], None] | None = None,
        after_due: Callable[[], bool] | None = None,
    ) -> None:
        self._after = after
        self._after_due = after_due
        self._queue: SimpleQueue[tuple[Any, ...] | None] = SimpleQueue()
        self._count = max(1, threads)
        self._name = name
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._pending = 0

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if not self._threads:
            self._start()
        with self._lock:
            if self._closed:
                raise RuntimeError("the storage provider is closed")
            self._pending += 1
            self._queue.put((loop, future, fn, args))
        return future

    @property
    def idle(self) -> bool:
        """No call queued or running (housekeeping after a call included)."""
        return self._pending == 0

    def _start(self) -> None:
        with self._lock:
            if self._threads or self._closed:
                return
            for number in range(self._count):
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{number}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            loop, future, fn, args = item
            if future.cancelled():
                self._done()
                continue
            try:
                outcome, failed = fn(*args), False
            except BaseException as error:
                outcome, failed = error, True
            # Idle before the caller hears the outcome, unless housekeeping follows: a caller
            # that checks `idle` next must find it so (see `SqlStorage.run_quick`).
            housekeeping = self._after is not None and (
                self._after_due is None or self._after_due()
            )
            if not housekeeping:
                self._done()
            with suppress(RuntimeError):  # a closed loop: nobody waits for the outcome
                loop.call_soon_threadsafe(_settle, future, outcome, failed)
            del item, future, outcome, args
            if housekeeping:
                try:
                    self._after()  # type: ignore[misc]
                except Exception as error:  # housekeeping only; the next call goes ahead
                    log.debug("%s: after-call housekeeping failed: %s", self._name, error)
                self._done()

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1

    def shutdown(self) -> None:
        """Run what is queued, then stop the threads; later submissions are refused."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._queue.put(None)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()


def _settle(future: asyncio.Future[Any], outcome: Any, failed: bool) -> None:
    if future.cancelled():
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
