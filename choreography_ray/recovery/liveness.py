"""Whether another host is still there: bounded waits and the owner-liveness rule.

A host that does not answer within `host_call_timeout` is treated as gone, exactly like one
that died: no call between hosts may wait forever on a process that hangs. Plain Python over a
clock and a ping, so the rule runs in-process under a fake clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from ..engine.clock import Clock
from ..jobs.state import JobOwner

T = TypeVar("T")


class HostGone(ConnectionError):
    """Raised when a host died, is unknown, or did not answer within the bound."""

    def __init__(self, host: str, why: str) -> None:
        super().__init__(f"host {host} is gone: {why}")
        self.host = host


class Bound:
    """Calls that must be answered within `seconds` on `clock`, else `HostGone`.

    One timer checks every call in flight, a quarter of the bound apart, rather than one timer
    per call: dispatches and reports are hot paths, and a timer task of their own made a call
    cost about four times as much on the caller's loop. A call that does not answer is given
    up between one and one and a quarter bounds after it was made."""

    def __init__(self, seconds: float, clock: Clock) -> None:
        self.seconds = seconds
        self.clock = clock
        self._waiting: dict[asyncio.Future[Any], datetime] = {}
        self._expired: set[asyncio.Future[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def __call__(self, call: Awaitable[T], host: str) -> T:
        """`call`'s answer, or `HostGone` naming `host` once the bound passed without one."""
        answer = asyncio.ensure_future(call)
        self._waiting[answer] = self.clock.now() + timedelta(seconds=self.seconds)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        try:
            return await answer
        except asyncio.CancelledError:
            if answer in self._expired:
                raise HostGone(host, f"no answer within {self.seconds:g}s") from None
            raise
        finally:
            self._waiting.pop(answer, None)
            self._expired.discard(answer)

    async def _sweep(self) -> None:
        try:
            while self._waiting:
                await self.clock.sleep(self.seconds / 4)
                now = self.clock.now()
                for answer, deadline in list(self._waiting.items()):
                    if deadline <= now and not answer.done():
                        self._expired.add(answer)
                        answer.cancel()
        finally:
            self._sweeper = None


async def owner_alive(owner: JobOwner, me: JobOwner, ping: Callable[[str], Awaitable[int]]) -> bool:
    """Whether the activation that owns a job still runs.

    This host answers for itself; another host is alive only if it answers a ping (which is
    bounded) with the epoch the job recorded: a replacement of the same name is a new
    activation, and the job is taken over from the one that is gone."""
    if owner.host == me.host:
        return owner.activation_epoch == me.activation_epoch
    try:
        epoch = await ping(owner.host)
    except Exception:
        return False
    return bool(epoch == owner.activation_epoch)
