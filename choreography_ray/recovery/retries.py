"""Recovery that failed, tried again alone: after 1 s, doubling to 60 s, until it works.

A host start, a partition's rehydration or a key listing can fail on a storage hiccup; nothing
else would ever try it again (no membership change need come), so the failed attempt is retried
on its own. Each key has its own chain of attempts, so one failing partition never holds up
another, and no chain blocks a pass that membership triggers: that pass simply attempts again.
Plain Python over the injectable clock, so the policy runs in-process under a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterable
from typing import Any, Generic, TypeVar

from ..engine.clock import Clock
from ..jobs.retry import Backoff

log = logging.getLogger("choreography_ray.recovery")

K = TypeVar("K", bound=Hashable)

FIRST_RETRY = 1.0
"""Seconds before the first retry of a failed attempt."""
LONGEST_RETRY = 60.0
"""The longest wait between two retries; the wait doubles up to it."""


class Retries(Generic[K]):
    """Attempts per key; a failed one is retried in the background until it succeeds or
    `close` is called."""

    def __init__(
        self,
        attempt: Callable[[K], Awaitable[None]],
        clock: Clock,
        *,
        what: str,
        first: float = FIRST_RETRY,
        longest: float = LONGEST_RETRY,
    ) -> None:
        self._attempt = attempt
        self.clock = clock
        self.what = what
        self.first = first
        self.longest = longest
        self._failing: set[K] = set()
        self._chains: dict[K, asyncio.Task[None]] = {}
        self._closed = False

    @property
    def failing(self) -> frozenset[K]:
        """Keys whose last attempt failed and that are being retried."""
        return frozenset(self._failing)

    async def run(self, key: K) -> None:
        """Attempt `key` now; when it fails, retry it in the background and raise the failure
        to this caller. A success stops the retries of `key`."""
        try:
            await self._attempt(key)
        except Exception as error:
            self._retry(key, error)
            raise
        self._failing.discard(key)

    def failed(self, key: K, error: Exception) -> None:
        """An attempt of `key` made elsewhere failed: retry it in the background."""
        self._retry(key, error)

    def succeeded(self, key: K) -> None:
        """An attempt of `key` made elsewhere succeeded: its retries stop."""
        self._failing.discard(key)

    def _retry(self, key: K, error: Exception) -> None:
        if self._closed:
            return
        self._failing.add(key)
        if key in self._chains:
            return  # one chain per key: it attempts again at its own pace
        log.warning("%s %s failed, retrying in %gs: %s", self.what, key, self.first, error)
        chain = asyncio.get_running_loop().create_task(self._chain(key))
        self._chains[key] = chain
        chain.add_done_callback(lambda _: self._chains.pop(key, None))

    async def _chain(self, key: K) -> None:
        backoff = Backoff(self.first, self.longest)
        delay = backoff.next()
        while True:
            await self.clock.sleep(delay)
            if key not in self._failing:
                return  # another caller's attempt succeeded meanwhile
            try:
                await self._attempt(key)
            except Exception as error:
                delay = backoff.next()
                log.warning("%s %s failed again, retrying in %gs: %s", self.what, key, delay, error)
                continue
            self._failing.discard(key)
            return

    def close(self) -> None:
        """Stop every retry (the host stops)."""
        self._closed = True
        for chain in list(self._chains.values()):
            chain.cancel()


class Startup:
    """A host's start: shared while under way, kept once it succeeded, and begun again after
    it failed, by the next caller or by the retries, so one storage error at start never
    breaks a host for good."""

    def __init__(
        self, start: Callable[[], Coroutine[Any, Any, None]], clock: Clock, *, what: str
    ) -> None:
        self._start = start
        self._task: asyncio.Task[None] | None = None
        self._retries: Retries[str] = Retries(self._begin, clock, what=what)

    async def wait(self) -> None:
        """Return once the start succeeded; raise its failure (and retry it) when it failed."""
        task = self._task
        if task is not None and task.done() and not task.cancelled() and not task.exception():
            return  # started: the hot path of every host call
        await self._retries.run("start")

    async def _begin(self, _: str) -> None:
        task = self._task
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._task = asyncio.get_running_loop().create_task(self._start())
        await asyncio.shield(task)

    def close(self) -> None:
        self._retries.close()


class Partitions(Generic[K]):
    """The partitions a controller host has rehydrated. A partition is known only once its
    rehydration succeeded; one that failed is retried alone, and asked again by every pass."""

    def __init__(self, rehydrate: Callable[[K], Awaitable[None]], clock: Clock, *, what: str):
        self._rehydrate = rehydrate
        self.known: set[K] = set()
        self._retries: Retries[K] = Retries(self._recover, clock, what=what)

    @property
    def failing(self) -> frozenset[K]:
        return self._retries.failing

    async def recover(self, keys: Iterable[K], *, again: bool = False) -> None:
        """Rehydrate every partition of `keys` not yet known (with `again`, known ones too: a
        membership change may have left their jobs without a live activation); failures are
        logged and retried in the background, and never hold up the partitions after them.
        A partition being retried is attempted at once, not after its chain's wait."""
        for key in keys:
            if again or key not in self.known:
                with contextlib.suppress(Exception):
                    await self._retries.run(key)

    async def _recover(self, key: K) -> None:
        await self._rehydrate(key)
        self.known.add(key)

    def close(self) -> None:
        self._retries.close()
