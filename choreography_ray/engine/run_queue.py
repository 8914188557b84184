"""Runs waiting for a throttle slot, queued per job and taken round-robin by job.

One queue for every job would let a large job starve a small one: a 5-step job dispatched
behind 1,500 queued steps would wait for all of them. Here each job that has queued runs holds
one place in a ring; a free slot takes the first run of the job at the front, and that job
moves to the back while it has more. Every job with queued work thus gets every n-th slot
(n: the jobs with queued work), in the order its runs arrived.

Taking and adding are O(1) per run: no scan over the jobs. With one job the ring holds one
queue, and a run costs what a plain FIFO costs.

Priorities (`priority`): while some queued job has points other than 0, a free slot goes to
the job of the highest effective priority (its points, raised by its wait since its last
slot), ties in ring order; that costs a clock reading and a pass over the jobs per slot, and
only then.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from ..jobs.state import JobKey
from .priority import effective
from .rates import RateGates
from .run import StepRun
from .step_key_gates import StepKeyGates

JobRef = tuple[JobKey, str]
"""A job, as (partition, job id): job ids are unique per partition only."""


class _JobRuns(deque[StepRun]):
    """One job's queued runs, in arrival order; knows its job to leave the ring when empty."""

    __slots__ = ("job", "points", "since")

    def __init__(self, job: JobRef) -> None:
        super().__init__()
        self.job = job
        self.points = 0.0
        """The job's priority points (`priority.points`)."""
        self.since = 0.0
        """When the job last got a slot (or came to wait), while priorities are in use."""


class RunQueue:
    """Runs waiting for a slot: per job, taken round-robin by job, or by effective priority
    while a job has points (`seconds`: the clock, in seconds; `aging`: points a minute)."""

    def __init__(
        self,
        seconds: Callable[[], float] | None = None,
        aging: float = 1.0,
        gates: RateGates | None = None,
        keys: StepKeyGates | None = None,
    ) -> None:
        self._by_job: dict[JobRef, _JobRuns] = {}
        self._ring: deque[_JobRuns] = deque()
        self._size = 0
        self._seconds = seconds or (lambda: 0.0)
        self._aging = aging
        self._prioritized = 0
        """Queued jobs whose points are not 0: while there are none, the ring decides."""
        self._gates = gates
        """Where runs of rate-limited step types wait for a token before they are queued."""
        if gates is not None:
            gates.release = self._released
        self.keys = keys
        """Where runs whose step-level key is full wait, out of the queue (a stop finds them)."""
        if keys is not None:
            keys.requeue = self.requeue

    def __len__(self) -> int:
        return self._size

    def extend(
        self,
        job: JobRef,
        runs: Iterable[StepRun],
        *,
        first: bool = False,
        points: float | None = None,
    ) -> None:
        """Queue `runs` of `job` behind the runs it has queued already (`first`: ahead of
        them, in their order: runs sent again after they were lost). `points`: the job's
        priority points now (None: as they were). Runs of a rate-limited step type wait for
        their token first (`RateGates`)."""
        if self._gates is not None:
            runs = self._gates.hold(job, runs, first, points)
        self._queue(job, runs, first, points)

    def requeue(self, job: JobRef, runs: list[StepRun]) -> None:
        """Queue runs that got their keys' places after a wait: behind the job's runs that
        got theirs before (one key's runs never pass another's), ahead of its other runs."""
        queue = self._by_job.get(job)
        if queue is None:
            self._queue(job, runs, False, None)
            return
        at = 0
        while at < len(queue) and (place := queue[at].place) is not None and place.held:
            at += 1
        for offset, run in enumerate(runs):
            queue.insert(at + offset, run)
        self._size += len(runs)

    def _released(
        self, job: JobRef, runs: list[StepRun], first: bool, points: float | None
    ) -> None:
        self._queue(job, runs, first, points)

    def _queue(
        self, job: JobRef, runs: Iterable[StepRun], first: bool, points: float | None
    ) -> None:
        queue = self._by_job.get(job)
        fresh = queue is None
        if queue is None:
            queue = _JobRuns(job)
            if self._prioritized:
                queue.since = self._seconds()
        if points is not None and not fresh:
            self._prioritize(queue, points)
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
            if points is not None:
                self._prioritize(queue, points)

    def prioritize(self, job: JobRef, points: float) -> None:
        """The job's priority points changed: its queued runs wait by them from now on."""
        queue = self._by_job.get(job)
        if queue is not None:
            self._prioritize(queue, points)

    def _prioritize(self, queue: _JobRuns, points: float) -> None:
        if bool(queue.points) == bool(points):
            queue.points = points
            return
        if points and not self._prioritized:
            now = self._seconds()  # the waits count from here: the ring was fair until now
            for queued in self._ring:
                queued.since = now
        self._prioritized += 1 if points else -1
        queue.points = points

    def pop(self) -> StepRun | None:
        """The next run of the job whose turn it is, or None when nothing is queued."""
        ring = self._ring
        if not ring:
            return None
        if self._prioritized:
            return self._pop_first()
        queue = ring[0]
        run = queue.popleft()
        self._size -= 1
        if queue:
            ring.rotate(-1)  # this job's next run waits for every other job's turn
        else:
            ring.popleft()
            del self._by_job[queue.job]
        return run

    def _pop_first(self) -> StepRun:
        """The next run of the job of the highest effective priority (the first in the ring
        among equals); that job waits at the back of the ring again."""
        now = self._seconds()
        aging = self._aging
        best = self._ring[0]
        best_score = effective(best.points, now - best.since, aging)
        for queue in self._ring:
            score = effective(queue.points, now - queue.since, aging)
            if score > best_score:
                best, best_score = queue, score
        run = best.popleft()
        self._size -= 1
        best.since = now
        if best:
            self._out_of_ring(best)
            self._ring.append(best)
        else:
            self._leave(best)
        return run

    def remove(self, job: JobRef, runs: Iterable[StepRun]) -> list[StepRun]:
        """Take those of `runs` that are still queued out of the queue (in one pass over the
        job's queue, however many are stopped); return them."""
        wanted = {id(run) for run in runs}
        held = [] if self._gates is None else self._gates.remove(job, wanted)
        if self.keys is not None:
            held += self.keys.remove(job, wanted)
        queue = self._by_job.get(job)
        if queue is None:
            return held
        kept = [run for run in queue if id(run) not in wanted]
        if len(kept) == len(queue):
            return held
        removed = [run for run in queue if id(run) in wanted]
        queue.clear()
        queue.extend(kept)
        self._size -= len(removed)
        if not queue:
            self._leave(queue)
        return held + removed

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
        self._prioritized = 0
        if self._gates is not None:
            self._gates.clear()

    def _leave(self, queue: _JobRuns) -> None:
        """An emptied job leaves the ring."""
        self._out_of_ring(queue)
        del self._by_job[queue.job]
        if queue.points:
            self._prioritized -= 1

    def _out_of_ring(self, queue: _JobRuns) -> None:
        """Take `queue` out of the ring (found by identity: deques compare by content)."""
        for index, queued in enumerate(self._ring):
            if queued is queue:
                del self._ring[index]
                return
