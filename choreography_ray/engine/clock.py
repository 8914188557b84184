"""Time for the engine: the system clock, or a fake one that tests move by hand.

Every timeout, backoff, lease and flush interval in the engine asks its `Clock`, so a test
advances a `FakeClock` instead of sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that stands still until `advance` moves it; sleepers wake in deadline order."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()

    def now(self) -> datetime:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        deadline = self._now + timedelta(seconds=seconds)
        heapq.heappush(self._sleepers, (deadline, next(self._counter), future))
        await future

    @property
    def sleepers(self) -> int:
        return sum(1 for *_, future in self._sleepers if not future.done())

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking every sleeper whose deadline passes, in order."""
        target = self._now + timedelta(seconds=seconds)
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            if not future.done():
                future.set_result(None)
            await settle()
        self._now = target
        await settle()


async def within(clock: Clock, seconds: float, awaitable: Awaitable[T]) -> T:
    """`awaitable`'s answer, or `TimeoutError` once `seconds` passed on `clock` (the
    awaitable is then cancelled; work in a thread runs on, unheard)."""
    task = asyncio.ensure_future(awaitable)
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait((task, timer), return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
    if task.done():
        return task.result()
    task.cancel()
    raise TimeoutError(f"no answer within {seconds:g} s")


async def settle(rounds: int = 20) -> None:
    """Let every task that is ready run, several loop turns deep."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def until_done(deadline: asyncio.Future[None], tasks: Callable[[], Iterable[Any]]) -> None:
    """Wait until none of `tasks()` (asked again as they end) is left running, or until
    `deadline` (a sleep on a clock) is done."""
    while not deadline.done():
        waiting = {task for task in tasks() if not task.done()}
        if not waiting:
            return
        await asyncio.wait({*waiting, deadline}, return_when=asyncio.FIRST_COMPLETED)
