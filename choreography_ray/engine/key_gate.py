"""A job's admission under its concurrency key (`concurrency`), before it dispatches."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..jobs.state import KeyWait
from ..jobs.status import JobStatus
from .activation import ActivationCore
from .concurrency import admit


class KeyGate:
    """One activation's admission under its concurrency key (see the module's docstring)."""

    def __init__(self, core: ActivationCore, retry: Callable[[], Awaitable[None]]) -> None:
        self.core = core
        self._retry = retry
        """Moves the job on again (its stages' `advance`, then a save), in the job's turn."""
        self._admitted: int | None = None
        """The execution generation the job was admitted in."""
        self._waiting: asyncio.Task[None] | None = None

    def limit(self) -> int | None:
        concurrency = self.core.job_class.concurrency
        return concurrency.max_running if concurrency is not None else None

    async def admit(self) -> bool:
        """Whether the job may dispatch now: it has no key, was admitted in this generation,
        or takes a place now. Otherwise it waits, visibly, and is moved on once admitted."""
        core = self.core
        state = core.record.state
        key = state.concurrency_key
        if key is None or self._admitted == state.execution_generation:
            return True
        limit = self.limit()
        waiters = core.ctx.keys
        ctx = core.ctx
        first = not waiters.ahead(key, core.id)
        if limit is None or await admit(
            ctx.storage, ctx.registry, core.id, key, limit, may_take=first
        ):
            self._admitted = state.execution_generation
            state.waiting_for_key = None
            waiters.leave(key, core.id)
            waiters.poke(key)  # the next one here may fit as well
            return True
        if state.waiting_for_key is None:
            state.waiting_for_key = KeyWait(key=key, limit=limit, since=ctx.clock.now())
            core.log.info("job %s: %s", core.id, state.waiting_for_key.text())
        waiters.join(key, core.id)
        if self._waiting is None or self._waiting.done():
            self._waiting = core.spawn(self._wait(key))
        return False

    async def _wait(self, key: str) -> None:
        core = self.core
        record = core.record
        every = core.ctx.options.concurrency_poll_interval.total_seconds()
        try:
            while True:
                woken = asyncio.ensure_future(core.ctx.keys.woken(key).wait())
                timer = asyncio.ensure_future(core.ctx.clock.sleep(every))
                try:
                    await asyncio.wait((woken, timer), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
                    timer.cancel()
                async with core.turn:
                    state = record.state
                    if record.released or state.status != JobStatus.RUNNING:
                        return
                    if self._admitted == state.execution_generation:
                        return
                    await self._retry()
                    if self._admitted == state.execution_generation:
                        return
        except Exception as error:  # a write that failed let the job go: recovery takes it
            core.log.warning("job %s: waiting for key %s ended: %s", core.id, key, error)
        finally:
            core.ctx.keys.leave(key, core.id)
