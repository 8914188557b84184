"""Whether another host is still there: bounded waits and the owner-liveness rule.

A host that does not answer within `host_call_timeout` is treated as gone, exactly like one
that died: no call between hosts may wait forever on a process that hangs. Plain Python over a
clock and a ping, so the rule runs in-process under a fake clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..engine.clock import Clock
from ..jobs.state import JobOwner

T = TypeVar("T")


class HostGone(ConnectionError):
    """Raised when a host died, is unknown, or did not answer within the bound."""

    def __init__(self, host: str, why: str) -> None:
        super().__init__(f"host {host} is gone: {why}")
        self.host = host


async def within(call: Awaitable[T], seconds: float, clock: Clock, host: str) -> T:
    """`call`'s answer, or `HostGone` once `seconds` pass on `clock` without one."""
    answer = asyncio.ensure_future(call)
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait((answer, timer), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        answer.cancel()
        raise
    finally:
        timer.cancel()
    if answer.done():
        return answer.result()
    answer.cancel()
    raise HostGone(host, f"no answer within {seconds:g}s")


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
