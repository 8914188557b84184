"""Group commit of step records.

Step runs mark their record dirty; the writer flushes every dirty record of a partition in one
`save_many`, then tells each run which of its changes are durable. A record changed twice before
a flush is written once, with its latest content, so a fast step's Running and outcome writes
collapse into one. Per-record write order is kept: a record is never in two flushes at once.

Storage that is unavailable (the provider's own retries ran out) is a state, not a loss: the
batch is held, with every change that arrives meanwhile, and written again after a backoff
until a write succeeds. The worker is told when the outage begins and ends, and starts no new
run in between (docs/recovery.md, "Storage outages").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..jobs.errors import StorageUnavailableError, VersionConflictError
from ..jobs.registry import snapshot
from ..jobs.retry import Backoff
from ..jobs.state import JobKey, JobStepState
from ..storage.protocols import JobsStorage
from .clock import Clock
from .unanswered import landed_write

log = logging.getLogger("choreography_ray.engine")

_GATHER_TURNS = 512
"""Loop turns a flush may wait while every turn brings more changes."""
_GATHER_SECONDS = 0.004
"""And how long, at most: a bound on the latency the gathering adds to an outcome."""
_UNANSWERED_KEPT = 8
"""Unanswered writes remembered per record: its changes during one outage (Running, a few
checkpoints, the outcome). Forgetting one only risks what happened before: a stale run."""


class StaleRecord(Exception):
    """The record changed under the run: another run or the job wrote it. The run must stop."""


Durable = Callable[[BaseException | None], None]
"""Told once a change is durable (None), or why it never will be (`StaleRecord`, or what
storage answered)."""


@dataclass(eq=False)
class Tracked:
    """A step record some run keeps, with the sequence of its latest change."""

    state: JobStepState
    changes: int = 0
    durable: int = 0
    waiters: list[tuple[int, Durable]] = field(default_factory=list)
    stale: bool = False
    unanswered: list[tuple[int, JobStepState]] = field(default_factory=list)
    """Writes of the record since its last durable one whose answer never came (storage went
    away): one of them may have landed. Each with the sequence of the change it carried."""

    def mark(self) -> int:
        self.changes += 1
        return self.changes

    def unanswered_write(self, sequence: int, saved: JobStepState) -> None:
        """A write of change `sequence` got no answer; the same change again adds nothing.
        The first is always kept: the write in flight as the connection dropped is the one
        likely to have landed; later ones mostly found no connection at all."""
        if self.unanswered and self.unanswered[-1][0] == sequence:
            return
        self.unanswered.append((sequence, saved))
        if len(self.unanswered) > _UNANSWERED_KEPT:
            del self.unanswered[1]


class StepWriter:
    """Flushes dirty step records of one partition, in batches, one flush at a time."""

    def __init__(
        self,
        key: JobKey,
        storage: JobsStorage,
        *,
        clock: Clock,
        backoff: Backoff,
        max_batch: int = 1000,
        on_stale: Callable[[Tracked], None] | None = None,
        after_flush: Callable[[StepWriter], None] | None = None,
    ) -> None:
        """`on_stale` is told of a record that changed in storage under its run, once;
        `after_flush` after every batch written or held (`unavailable` says which, `pending`
        how many records wait)."""
        self.key = key
        self.storage = storage
        self.clock = clock
        self.backoff = backoff
        self.max_batch = max_batch
        self.on_stale = on_stale
        self.after_flush = after_flush
        self._dirty: dict[tuple[str, str], Tracked] = {}
        self._writing = 0
        self._task: asyncio.Task[None] | None = None
        self._holding = False
        self._closed = False
        self.unavailable: StorageUnavailableError | None = None
        """The error of the last write while storage refuses them; None while it takes them."""
        self._down_since = 0.0
        self.flushes = 0
        self.records_written = 0

    def write(self, record: Tracked, then: Durable) -> None:
        """Mark `record` changed; `then` is told once this change is durable, or why it never
        will be (at once when the record is already known stale).

        Called by the flush that wrote the record, not scheduled: a future per outcome, and
        the loop turn that ran its callback, cost every outcome a few microseconds
        (decisions.md, "The group commit calls each run back directly")."""
        sequence = record.mark()
        if record.stale:
            _tell(then, StaleRecord(record.state.id))
            return
        record.waiters.append((sequence, then))
        self._schedule(record)

    def write_later(self, record: Tracked) -> None:
        """Mark `record` changed, for a caller that does not wait for this change (a later
        write of the same record, which is kept in order after it, is waited for instead)."""
        record.mark()
        if not record.stale:
            self._schedule(record)

    def _schedule(self, record: Tracked) -> None:
        self._dirty[(record.state.job_id, record.state.id)] = record
        if (self._task is None or self._task.done()) and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._flush_loop())

    @property
    def flush(self) -> asyncio.Task[None] | None:
        """The flush under way, if any."""
        task = self._task
        return task if task is not None and not task.done() else None

    def close(self) -> None:
        """The worker shuts down: nothing more is written (held records stay as storage
        has them, for recovery)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()

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
        while self._dirty and not self._closed:
            batch = list(self._dirty.values())[: self.max_batch]
            for record in batch:
                del self._dirty[(record.state.job_id, record.state.id)]
            self._writing = len(batch)
            try:
                held = await self._flush(batch)
            finally:
                self._writing = 0
            if not held:
                if self.after_flush is not None:
                    self.after_flush(self)
                continue
            # Held: the records go back ahead of the changes that came since (a record in
            # both keeps its place and its latest content), and are tried again later.
            since = self._dirty
            self._dirty = {(r.state.job_id, r.state.id): r for r in held}
            self._dirty.update(since)
            if self.after_flush is not None:
                self.after_flush(self)
            self._holding = True
            try:
                await self.clock.sleep(self.backoff.next())
            finally:
                self._holding = False

    async def _flush(self, batch: list[Tracked]) -> list[Tracked]:
        """Write `batch`; what is left to hold when storage is unavailable."""
        while batch:
            snapshots = [(record, record.changes, snapshot(record.state)) for record in batch]
            try:
                versions = await self.storage.steps.save_many([s for _, _, s in snapshots])
            except VersionConflictError as conflict:
                lost = set(conflict.conflicts)
                applied = getattr(conflict, "applied", {}) or {}
                remaining = []
                conflicted = []
                for record, sequence, saved in snapshots:
                    if saved.id in lost:
                        conflicted.append((record, sequence, saved))
                    elif saved.id in applied:
                        self._durable(record, sequence, applied[saved.id])
                    else:
                        remaining.append(record)
                held = await self._settle_conflicts(conflicted) if conflicted else []
                if held:
                    return held + remaining
                self._up()  # a conflict is an answer too: storage takes writes again
                batch = remaining
                continue
            except StorageUnavailableError as error:  # the provider's retries ran out
                self._down(error, len(batch))
                for record, sequence, saved in snapshots:
                    record.unanswered_write(sequence, saved)
                return batch
            except Exception as error:  # not storage being away: the runs must know
                log.error("step records of %s were refused by storage: %s", self.key, error)
                for record, _, _ in snapshots:
                    self._fail(record, error)
                return []
            self._up()
            self.flushes += 1
            self.records_written += len(snapshots)
            for (record, sequence, _), version in zip(snapshots, versions, strict=True):
                self._durable(record, sequence, version)
            return []
        return []

    async def _settle_conflicts(
        self, conflicted: list[tuple[Tracked, int, JobStepState]]
    ) -> list[Tracked]:
        """Records whose write lost: stale, unless what storage holds is a write of their own
        whose answer was lost (the connection dropped between commit and reply, and the write
        was made again expecting the version before it). Such a record takes the stored
        version and goes on. Returns the records to hold: storage went away again.

        The write that lost is a candidate too: a provider may have retried it within the
        call after its first attempt had landed unanswered."""
        for record, sequence, saved in conflicted:
            record.unanswered_write(sequence, saved)
        by_job: dict[str, list[str]] = {}
        for _, _, saved in conflicted:
            by_job.setdefault(saved.job_id, []).append(saved.id)
        stored: dict[tuple[str, str], JobStepState] = {}
        try:
            for job_id, step_ids in by_job.items():
                for state in await self.storage.steps.get_many(job_id, step_ids):
                    stored[(job_id, state.id)] = state
        except StorageUnavailableError as error:
            self._down(error, len(conflicted))
            return [record for record, _, _ in conflicted]
        except Exception as error:  # unreadable: what storage holds is not known to be ours
            log.error("step records of %s could not be read back: %s", self.key, error)
        for record, _, saved in conflicted:
            found = stored.get((saved.job_id, saved.id))
            landed = None if found is None else landed_write(found, record.unanswered)
            if found is None or landed is None:
                self._stale(record)
                continue
            log.info("step %s of job %s: its unanswered write had landed", saved.id, saved.job_id)
            self._durable(record, landed, found.version)
        return []

    def _down(self, error: StorageUnavailableError, held: int) -> None:
        first = self.unavailable is None
        self.unavailable = error
        if first:
            self._down_since = time.monotonic()
            log.warning(
                "storage refuses step writes of %s (%s); %d record(s) held, written when it "
                "answers again; no new step starts here meanwhile",
                self.key,
                error,
                held,
            )

    def _up(self) -> None:
        if self.unavailable is None:
            return
        self.unavailable = None
        self.backoff.reset()
        log.warning(
            "storage takes step writes of %s again, after %.1f s",
            self.key,
            time.monotonic() - self._down_since,
        )

    def _durable(self, record: Tracked, sequence: int, version: int) -> None:
        record.state.version = version
        record.durable = max(record.durable, sequence)
        if record.unanswered:
            record.unanswered.clear()  # the stored version is known again
        told: list[tuple[int, Durable]] = []
        keep: list[tuple[int, Durable]] = []
        for waiter in record.waiters:
            (told if waiter[0] <= sequence else keep).append(waiter)
        record.waiters = keep
        if record.changes > sequence and not record.stale:
            self._dirty[(record.state.job_id, record.state.id)] = record
        for _, then in told:
            _tell(then, None)

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
        waiters, record.waiters = record.waiters, []
        for _, then in waiters:
            _tell(then, error)

    @property
    def pending(self) -> int:
        """Records with a change not yet durable: waiting, being written, or held."""
        return len(self._dirty) + self._writing

    @property
    def busy(self) -> bool:
        """Records on their way to storage; not while the writer waits out an outage's
        backoff, which moves only with the clock."""
        if self._holding:
            return False
        return bool(self._dirty) or (self._task is not None and not self._task.done())


def _tell(then: Durable, error: BaseException | None) -> None:
    """Tell one waiter; what it raises is logged, and the other waiters are still told."""
    try:
        then(error)
    except Exception:
        log.exception("a step write's waiter failed")


UNWRITTEN_LIMIT = 2000
"""Step records whose changes are not yet durable, past which no new run starts: two group
commits' worth, so writing never waits on running, while the work a lost worker takes with
it (and that runs again elsewhere) stays bounded — the in-flight window."""


class StepWriters:
    """A worker's group commits, one per partition, and what they tell together: whether a
    new run may start now — not while storage refuses writes, nor while `limit` records wait
    to be written."""

    def __init__(
        self,
        storage_for: Callable[[JobKey], JobsStorage],
        clock: Clock,
        backoff: Callable[[], Backoff],
        *,
        on_stale: Callable[[JobKey, Tracked], None],
        on_free: Callable[[], None],
    ) -> None:
        """`on_free` is told after a batch is written while runs may start again."""
        self._storage_for = storage_for
        self._clock = clock
        self._backoff = backoff
        self._on_stale = on_stale
        self._on_free = on_free
        self._writers: dict[JobKey, StepWriter] = {}
        self._down: set[JobKey] = set()
        self.limit = UNWRITTEN_LIMIT

    def for_key(self, key: JobKey) -> StepWriter:
        writer = self._writers.get(key)
        if writer is None:
            writer = self._writers[key] = StepWriter(
                key,
                self._storage_for(key),
                clock=self._clock,
                backoff=self._backoff(),
                on_stale=lambda record: self._on_stale(key, record),
                after_flush=self._flushed,
            )
        return writer

    def _flushed(self, writer: StepWriter) -> None:
        if writer.unavailable is not None:
            self._down.add(writer.key)
            return
        self._down.discard(writer.key)
        if not self._down:
            self._on_free()

    @property
    def storage_down(self) -> bool:
        """Whether storage refuses some partition's writes now (the worker holds them)."""
        return bool(self._down)

    @property
    def holding_back(self) -> bool:
        """Whether no new run may start now: storage refuses writes, or too many wait."""
        if self._down:
            return True
        pending = 0
        for writer in self._writers.values():  # asked per run started: no generator
            pending += writer.pending
        return pending >= self.limit

    @property
    def busy(self) -> bool:
        return any(writer.busy for writer in self._writers.values())

    def stats(self) -> dict[str, int]:
        """Step records written, and in how many batches."""
        return {
            "step_batches": sum(w.flushes for w in self._writers.values()),
            "step_rows": sum(w.records_written for w in self._writers.values()),
        }

    def flushing(self) -> list[asyncio.Task[None]]:
        """The flushes under way (a worker that shuts down lets them land first)."""
        return [w.flush for w in self._writers.values() if w.flush is not None]

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
