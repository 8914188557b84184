"""Runs waiting for a throttle slot, queued per job and taken round-robin by job.

One queue for every job would let a large job starve a small one: a 5-step job dispatched
behind 1,500 queued steps would wait for all of them. Here each job that has queued runs holds
one place in a ring; a free slot takes the first run of the job at the front, and that job
moves to the back while it has more. Every job with queued work thus gets every n-th slot
(n: the jobs with queued work), in the order its runs arrived.

Taking and adding are O(1) per run: no scan over the jobs. With one job the ring holds one
queue, and a run costs what a plain FIFO costs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from ..jobs.state import JobKey
from .run import StepRun

JobRef = tuple[JobKey, str]
"""A job, as (partition, job id): job ids are unique per partition only."""


class _JobRuns(deque[StepRun]):
    """One job's queued runs, in arrival order; knows its job to leave the ring when empty."""

    __slots__ = ("job",)

    def __init__(self, job: JobRef) -> None:
        super().__init__()
        self.job = job


class RunQueue:
    """Runs waiting for a slot: per job, taken round-robin by job."""

    def __init__(self) -> None:
        self._by_job: dict[JobRef, _JobRuns] = {}
        self._ring: deque[_JobRuns] = deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def extend(self, job: JobRef, runs: Iterable[StepRun], *, first: bool = False) -> None:
        """Queue `runs` of `job` behind the runs it has queued already (`first`: ahead of
        them, in their order: runs sent again after they were lost)."""
        queue = self._by_job.get(job)
        fresh = queue is None
        if queue is None:
            queue = _JobRuns(job)
        before = len(queue)
        if first:
            queue.extendleft(reversed(list(runs)))
        else:
            queue.extend(runs)
        added = len(queue) - before
        if not added:
            return
        self._size += added
        if fresh:
            self._by_job[job] = queue
            self._ring.append(queue)  # a job new to the ring takes its turn after the others

    def pop(self) -> StepRun | None:
        """The next run of the job whose turn it is, or None when nothing is queued."""
        ring = self._ring
        if not ring:
            return None
        queue = ring[0]
        run = queue.popleft()
        self._size -= 1
        if queue:
            ring.rotate(-1)  # this job's next run waits for every other job's turn
        else:
            ring.popleft()
            del self._by_job[queue.job]
        return run

    def remove(self, job: JobRef, runs: Iterable[StepRun]) -> list[StepRun]:
        """Take those of `runs` that are still queued out of the queue (in one pass over the
        job's queue, however many are stopped); return them."""
        queue = self._by_job.get(job)
        if queue is None:
            return []
        wanted = {id(run) for run in runs}
        kept = [run for run in queue if id(run) not in wanted]
        if len(kept) == len(queue):
            return []
        removed = [run for run in queue if id(run) in wanted]
        queue.clear()
        queue.extend(kept)
        self._size -= len(removed)
        if not queue:
            self._leave(queue)
        return removed

    def take_last(self, job: JobRef, count: int) -> list[StepRun]:
        """Take up to `count` of `job`'s queued runs out of the queue, the latest first: the
        ones that would have waited longest here."""
        queue = self._by_job.get(job)
        if queue is None or count <= 0:
            return []
        taken = [queue.pop() for _ in range(min(count, len(queue)))]
        self._size -= len(taken)
        if not queue:
            self._leave(queue)
        return taken

    def queued(self, job: JobRef) -> int:
        queue = self._by_job.get(job)
        return len(queue) if queue is not None else 0

    def clear(self) -> None:
        self._by_job.clear()
        self._ring.clear()
        self._size = 0

    def _leave(self, queue: _JobRuns) -> None:
        """An emptied job leaves the ring (found by identity: deques compare by content)."""
        for index, queued in enumerate(self._ring):
            if queued is queue:
                del self._ring[index]
                break
        del self._by_job[queue.job]
