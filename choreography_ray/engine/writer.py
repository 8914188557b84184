"""Group commit of step records.

Step runs mark their record dirty; the writer flushes every dirty record of a partition in one
`save_many`, then tells each run which of its changes are durable. A record changed twice before
a flush is written once, with its latest content, so a fast step's Running and outcome writes
collapse into one. Per-record write order is kept: a record is never in two flushes at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..jobs.errors import VersionConflictError
from ..jobs.state import JobKey, JobStepState
from ..storage.protocols import JobsStorage

log = logging.getLogger("choreography_ray.engine")

_GATHER_TURNS = 512
"""Loop turns a flush may wait while every turn brings more changes."""
_GATHER_SECONDS = 0.004
"""And how long, at most: a bound on the latency the gathering adds to an outcome."""


class StaleRecord(Exception):
    """The record changed under the run: another run or the job wrote it. The run must stop."""


@dataclass(eq=False)
class Tracked:
    """A step record some run keeps, with the sequence of its latest change."""

    state: JobStepState
    changes: int = 0
    durable: int = 0
    waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    stale: bool = False

    def mark(self) -> int:
        self.changes += 1
        return self.changes


class StepWriter:
    """Flushes dirty step records of one partition, in batches, one flush at a time."""

    def __init__(
        self,
        key: JobKey,
        storage: JobsStorage,
        *,
        max_batch: int = 1000,
        on_stale: Callable[[Tracked], None] | None = None,
    ) -> None:
        """`on_stale` is told of a record that changed in storage under its run, once."""
        self.key = key
        self.storage = storage
        self.max_batch = max_batch
        self.on_stale = on_stale
        self._dirty: dict[tuple[str, str], Tracked] = {}
        self._task: asyncio.Task[None] | None = None
        self.flushes = 0
        self.records_written = 0

    def write(self, record: Tracked) -> asyncio.Future[None]:
        """Mark `record` changed; the future resolves once this change is durable."""
        sequence = record.mark()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if record.stale:
            future.set_exception(StaleRecord(record.state.id))
            return future
        record.waiters.append((sequence, future))
        self._schedule(record)
        return future

    def write_later(self, record: Tracked) -> None:
        """Mark `record` changed, for a caller that does not wait for this change (a later
        write of the same record, which is kept in order after it, is waited for instead)."""
        record.mark()
        if not record.stale:
            self._schedule(record)

    def _schedule(self, record: Tracked) -> None:
        self._dirty[(record.state.job_id, record.state.id)] = record
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        await asyncio.sleep(0)  # let the changes of this loop turn join the batch
        # While every turn brings more changes (one runner finishing a quick run per turn, as
        # with one slot), wait more turns: one commit, and one report, for many records rather
        # than for a few. A turn that brings nothing ends the wait, so a lone outcome is
        # written at once.
        until = time.perf_counter() + _GATHER_SECONDS
        for _ in range(_GATHER_TURNS):
            waiting = len(self._dirty)
            if waiting >= self.max_batch:
                break
            await asyncio.sleep(0)
            if len(self._dirty) == waiting or time.perf_counter() > until:
                break
        while self._dirty:
            batch = list(self._dirty.values())[: self.max_batch]
            for record in batch:
                del self._dirty[(record.state.job_id, record.state.id)]
            await self._flush(batch)

    async def _flush(self, batch: list[Tracked]) -> None:
        while batch:
            snapshots = [(record, record.changes, record.state.model_copy()) for record in batch]
            try:
                versions = await self.storage.steps.save_many([s for _, _, s in snapshots])
            except VersionConflictError as conflict:
                lost = set(conflict.conflicts)
                applied = getattr(conflict, "applied", {}) or {}
                remaining = []
                for record, sequence, snapshot in snapshots:
                    if snapshot.id in lost:
                        self._stale(record)
                    elif snapshot.id in applied:
                        self._durable(record, sequence, applied[snapshot.id])
                    else:
                        remaining.append(record)
                batch = remaining
                continue
            except Exception as error:  # storage down after retries: the runs must know
                for record, _, _ in snapshots:
                    self._fail(record, error)
                return
            self.flushes += 1
            self.records_written += len(snapshots)
            for (record, sequence, _), version in zip(snapshots, versions, strict=True):
                self._durable(record, sequence, version)
            return

    def _durable(self, record: Tracked, sequence: int, version: int) -> None:
        record.state.version = version
        record.durable = max(record.durable, sequence)
        keep = []
        for wanted, future in record.waiters:
            if wanted <= sequence:
                if not future.done():
                    future.set_result(None)
            else:
                keep.append((wanted, future))
        record.waiters = keep
        if record.changes > sequence and not record.stale:
            self._dirty[(record.state.job_id, record.state.id)] = record

    def _stale(self, record: Tracked) -> None:
        record.stale = True
        log.warning(
            "step %s of job %s changed in storage under its run; the run stops",
            record.state.id,
            record.state.job_id,
        )
        self._fail(record, StaleRecord(record.state.id))
        if self.on_stale is not None:
            self.on_stale(record)

    def _fail(self, record: Tracked, error: BaseException) -> None:
        for _, future in record.waiters:
            if not future.done():
                future.set_exception(error)
        record.waiters = []

    @property
    def busy(self) -> bool:
        return bool(self._dirty) or (self._task is not None and not self._task.done())
