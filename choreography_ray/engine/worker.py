"""The worker: a node's step runs, its throttle, group-committed outcomes, batched reports.

A worker receives starts in batches, loads the steps' records in one read (a step's first
start brings its record: `stored_steps`), and queues runs (`run.StepRun`). At most
`max_parallel_steps` perform at once, one runner task per slot, shared round-robin between the
jobs with queued runs (`run_queue.RunQueue`): a small job is never starved by a large one.
Outcomes go through the group-committing `StepWriters`, and only durable ones are reported to
their job, in batches (`outbox.Outbox`). While storage refuses writes, no new run starts: the
work done during an outage is never lost, nor done for nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ..jobs.errors import ActivationCallbackRejected, ChoreographyError, StartJobStepError
from ..jobs.options import JobsOptions
from ..jobs.registry import TypeKind, TypeRegistry
from ..jobs.retry import Backoff
from ..jobs.state import JobKey, JobStepState
from ..storage.protocols import JobsStorage
from .clock import Clock, until_done
from .limits import step_limits
from .messages import (
    SettledStops,
    StartOutcome,
    StartResult,
    StepReport,
    StepStart,
    StopRequest,
    StopResult,
)
from .outbox import Outbox
from .ports import JobReporter, StepPeers
from .rates import RateGates
from .run import StepRun
from .run_host import CallbackRejected, RunKey, StepMetrics, SyncRunner, SyncStepRunner, call_on
from .run_queue import RunQueue
from .settling import runs_to_stop, settled_within
from .step_key_gates import StepKeyGates
from .stored_steps import prepared_record, running_elsewhere, settled
from .writer import StepWriter, StepWriters, Tracked

log = logging.getLogger("choreography_ray.engine")

_UNKNOWN = StartJobStepError.UNKNOWN
_TURN_SECONDS = 0.0005
"""How long a runner performs runs back to back before it lets the loop's other work in."""


class StepWorker:
    """Runs steps for every job that dispatches to it; one per worker node."""

    def __init__(
        self,
        *,
        storage_for: Callable[[JobKey], JobsStorage],
        registry: TypeRegistry,
        options: JobsOptions,
        clock: Clock,
        reporter: JobReporter,
        max_parallel_steps: int | None = None,
        max_parallel_sync_steps: int | None = None,
        sync_runner: SyncRunner | None = None,
        node_id: str = "local",
        activation_id: str = "local",
        host: str = "local",
        peers: StepPeers | None = None,
    ) -> None:
        self.storage_for = storage_for
        self.registry = registry
        self.options = options
        self.clock = clock
        self.reporter = reporter
        limits = step_limits(max_parallel_steps or options.max_parallel_steps, os.cpu_count())
        self.max_parallel_steps = limits.performing
        """Runs performing at once, of any kind."""
        self.max_parallel_sync_steps = max_parallel_sync_steps or limits.synchronous
        """Of which synchronous (a Ray task each, on a CPU): more wait, still Scheduled."""
        self.sync_slots = asyncio.Semaphore(self.max_parallel_sync_steps)
        self.sync_runner: SyncRunner = sync_runner or SyncStepRunner()
        self.node_id = node_id
        self.activation_id = activation_id
        self.host = host
        """This worker host's name: written in the lease of every step it runs."""
        self.peers = peers
        self._runs: dict[RunKey, StepRun] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        default = partial(storage_for, JobKey())  # rate buckets, key places: one partition
        gates = RateGates(default, registry, clock, self._pump)
        keys = self.keys = StepKeyGates(default, registry, clock, options, host, activation_id)
        keys.ready, keys.room = self._pump, lambda: self.max_parallel_steps - self._performing
        self._queue = RunQueue(lambda: clock.now().timestamp(), options.priority_aging, gates, keys)
        self._performing = 0
        self._runners = 0
        self.writers = StepWriters(
            storage_for,
            clock,
            lambda: Backoff.between(
                options.transient_retry_base_delay, options.max_transient_retry_delay
            ),
            on_stale=self._stale,
            on_free=self._writers_free,
        )
        self.outbox = Outbox(reporter, options, clock, lambda: self.closed, storage_for)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.peak_parallel = 0
        self.runs_done = 0  # runs performed to their end: the console's step rate here
        self.closed = False
        self.metrics = StepMetrics()

    # -- plumbing ---------------------------------------------------------------------------

    def writer_for(self, key: JobKey) -> StepWriter:
        return self.writers.for_key(key)

    def _writers_free(self) -> None:
        """A batch was written and runs may start: the queue goes on where it waited."""
        if self._queue and self._runners < self.max_parallel_steps:
            self._pump()

    def _stale(self, job_key: JobKey, record: Tracked) -> None:
        """The record of a run changed in storage under it (another host runs the step now,
        or the job removed it): the run's work is stopped rather than left to finish for
        nothing. It reports nothing: its outcome's write fails as stale."""
        run = self._runs.get(RunKey(job_key, record.state.job_id, record.state.id))
        if run is not None and run.record is record:
            run.cancel(removing=False)

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        """Run a context callback on the worker's loop, from its thread or a step's thread."""
        call_on(self._loop, fn, *args)

    def callback(self, job_key: JobKey, job_id: str, step_id: str, kind: str, value: Any) -> bool:
        """A call from step work running elsewhere (a Ray task): checkpoint, progress, or
        whether the run was asked to stop. Refused (`CallbackRejected`) once the run is over."""
        run = self._runs.get(RunKey(job_key, job_id, step_id))
        if run is None:
            raise CallbackRejected(
                f"step {step_id} of job {job_id}: the run is over",
                code=ActivationCallbackRejected.NO_RUN,
            )
        return run.called_back(kind, value)

    @property
    def active_runs(self) -> int:
        return len(self._runs)

    @property
    def busy(self) -> bool:
        """Work that moves on by itself: runs waiting for a free slot, synchronous steps in
        threads, outcomes being written, or reports being sent. Async runs that wait on
        something else do not count."""
        return bool(
            (
                self._queue
                and self._performing < self.max_parallel_steps
                and not self.writers.storage_down
            )
            or self.sync_runner.in_flight
            or self.outbox.busy
            or self.writers.busy
        )

    def runs_of(self, job_id: str) -> list[StepRun]:
        return [run for key, run in self._runs.items() if key.job_id == job_id]

    # -- starting -------------------------------------------------------------------------

    async def start_steps(
        self,
        job_key: JobKey,
        job_id: str,
        job_type: str,
        starts: Sequence[StepStart],
        points: float | None = None,
    ) -> list[StartResult]:
        self._loop = asyncio.get_running_loop()
        if self.closed:
            why = "the worker is shutting down"
            return [StartResult(s.step_id, StartOutcome.FAILED, _UNKNOWN, why) for s in starts]
        stored = {
            start.step_id: prepared_record(job_id, start.step_id, start.prepared)
            for start in starts
            if start.prepared is not None
        }
        unknown = [start.step_id for start in starts if start.prepared is None]
        if unknown:
            for state in await self.storage_for(job_key).steps.get_many(job_id, unknown):
                stored[state.id] = state
        elsewhere = await running_elsewhere(self.peers, self.host, job_key, job_id, stored)
        queued: list[StepRun] = []
        results = [
            StartResult(
                start.step_id, StartOutcome.RUNNING_ELSEWHERE, reason=elsewhere[start.step_id]
            )
            if start.step_id in elsewhere
            else self._start_one(job_key, job_id, start, stored.get(start.step_id), queued)
            for start in starts
        ]
        job = (job_key, job_id)
        urgent = [run for run in queued if run.urgent]
        if urgent:
            self._queue.extend(job, urgent, first=True, points=points)
            queued = [run for run in queued if not run.urgent]
        self._queue.extend(job, queued, points=points)
        self._pump()
        return results

    def prioritize(self, job_key: JobKey, job_id: str, points: float) -> None:
        self._queue.prioritize((job_key, job_id), points)  # the job's priority changed

    def give_up(self, job_key: JobKey, job_id: str, share: float) -> list[str]:
        """Hand back `share` of the job's queued runs, not started (nothing of them written),
        the latest first, for its job to send elsewhere; runs that perform stay."""
        job = (job_key, job_id)
        count = int(self._queue.queued(job) * max(0.0, min(1.0, share)))
        given = self._queue.take_last(job, count)
        for run in given:
            run.closed = True
            self.release(run)
        return [run.step_id for run in given]

    def held(self, job_key: JobKey, job_id: str) -> list[str]:
        """Every step of the job with a run here (performing, queued or settling)."""
        return [k.step_id for k in self._runs if k.job_key == job_key and k.job_id == job_id]

    def running(self, job_key: JobKey, job_id: str, step_ids: Sequence[str]) -> list[str]:
        """Which of `step_ids` of the job have a run here (performing, queued or settling)."""
        runs = self._runs
        return [s for s in step_ids if RunKey(job_key, job_id, s) in runs]

    def _start_one(
        self,
        job_key: JobKey,
        job_id: str,
        start: StepStart,
        state: JobStepState | None,
        queued: list[StepRun],
    ) -> StartResult:
        """Start one step of a batch; a run ready to perform is added to `queued`."""
        key = RunKey(job_key, job_id, start.step_id)
        if state is None or not state.is_prepared:
            return StartResult(
                start.step_id,
                StartOutcome.FAILED,
                StartJobStepError.NOT_PREPARED,
                "the step has no prepared record",
            )
        existing = self._runs.get(key)
        if existing is not None:
            if existing.generation >= start.generation and existing.attempt >= start.attempt:
                return StartResult(start.step_id, StartOutcome.ALREADY_STARTED)
            existing.cancel(removing=False)  # an older run: it reports its stop, then ends
        answer = settled(start, state)
        if answer is not None:
            return answer
        try:
            step_class = self.registry.resolve(state.type, TypeKind.STEP)
        except ChoreographyError as error:
            return StartResult(start.step_id, StartOutcome.FAILED, _UNKNOWN, str(error))
        record = Tracked(state)
        run = StepRun(self, key, record, step_class, start)
        run.urgent = start.urgent
        if existing is not None:
            # One run per step: the new one waits for the old one to report its stop.
            previous = existing.done
            self._runs[key] = run
            self._spawn(self._after(previous, run))
        else:
            self._runs[key] = run
            queued.append(run)
        return StartResult(start.step_id, StartOutcome.STARTED)

    async def _after(self, previous: asyncio.Future[None], run: StepRun) -> None:
        """Queue `run` once the older run of its step has ended and written its outcome; the
        record read when `run` was started is older than that outcome, so it is read again."""
        await asyncio.shield(previous)
        if self._runs.get(run.key) is not run or self.closed:
            return
        key = run.key
        try:
            stored = await self.storage_for(key.job_key).steps.get_many(key.job_id, [key.step_id])
        except Exception as error:
            log.error("step %s of job %s was not started: %s", key.step_id, key.job_id, error)
            run.end()
            return
        if self._runs.get(key) is not run or self.closed:
            return
        if not stored or settled(StepStart(key.step_id, run.generation, run.attempt), stored[0]):
            # The older run finished the step after all (or it is gone): its report counts.
            run.end()
            return
        run.record = Tracked(stored[0])
        self._queue.extend((key.job_key, key.job_id), (run,))
        self._pump()

    def _pump(self) -> None:
        """Add runners while runs wait and slots are free; each runner takes run after run
        from the queue, so a task is made per slot, not per run."""
        waiting = len(self._queue) - (self._runners - self._performing)  # no runner awaits
        wanted = min(waiting, self.max_parallel_steps - self._runners)
        if wanted <= 0 or self.closed or self.writers.holding_back:  # the cheap test first
            return
        loop = asyncio.get_running_loop()
        for _ in range(wanted):
            self._runners += 1
            self._spawn(self._runner(), loop)

    async def _runner(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        queue = self._queue
        turn_ends = time.perf_counter() + _TURN_SECONDS
        try:
            writers = self.writers
            while not self.closed and self._performing < self.max_parallel_steps:
                if writers.holding_back:
                    break  # storage first: the next batch written pumps again
                run = queue.pop()
                if run is None:
                    break
                if run.step_class.concurrency is not None and not await self.keys.admit(run):
                    continue  # set aside without a slot until its key has a place
                run.holds_slot = True
                self._performing += 1
                self.peak_parallel = max(self.peak_parallel, self._performing)
                try:
                    await run.execute()
                finally:
                    run.release_slot()
                    self.keys.give_back(run)
                    self.runs_done += 1
                while task.cancelling():  # a stop that landed in the run's work, handled
                    task.uncancel()
                # Work that never waits (a no-op step) would let one runner take the whole
                # queue in one go, while outcome writes, reports and incoming batches wait:
                # the runner yields once its turn has lasted `_TURN_SECONDS`. Yielding after
                # every run instead cost a loop turn per step with one slot.
                now = time.perf_counter()
                if now >= turn_ends:
                    await asyncio.sleep(0)
                    turn_ends = time.perf_counter() + _TURN_SECONDS
        finally:
            self._runners -= 1

    def slot_freed(self) -> None:
        self._performing -= 1
        if self._queue:
            self._pump()

    def _spawn(self, coro: Any, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Keep a reference to every task, so none is collected while it runs."""
        task = (loop or asyncio.get_running_loop()).create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def release(self, run: StepRun) -> None:
        if self._runs.get(run.key) is run:
            del self._runs[run.key]
        self.keys.give_back(run)

    # -- stopping -------------------------------------------------------------------------

    async def stop_steps(self, request: StopRequest) -> StopResult:
        self._loop = asyncio.get_running_loop()
        result = StopResult()
        wanted = set(request.step_ids) if request.step_ids is not None else None
        told = []
        for key, run in list(self._runs.items()):
            if key.job_key != request.job_key or key.job_id != request.job_id:
                continue
            if wanted is not None and key.step_id not in wanted:
                continue
            if run.generation > request.generation:
                continue  # a stop of an earlier execution never stops a resumed run
            run.cancel(request.removing)
            result.stopping.append(key.step_id)
            told.append(run)
        for run in self._queue.remove((request.job_key, request.job_id), told):
            self._spawn(run.execute())  # never started: settles as stopped without a slot
        if wanted is not None:
            result.not_running = sorted(wanted - set(result.stopping))
        return result

    async def stop_and_wait(
        self, request: StopRequest, within: float | None = None
    ) -> SettledStops:
        """Stop the runs `request` names and wait, up to one deadline (`step_stop_timeout`),
        for each to settle and persist its outcome (`settling`)."""
        self._loop = asyncio.get_running_loop()
        timeout = within if within is not None else self.options.step_stop_timeout.total_seconds()
        runs = runs_to_stop(self._runs, request)
        await self.stop_steps(request)
        return await settled_within(runs, self.clock, timeout)

    def stop_all(self) -> int:
        """Stop every run here (the node goes): each settles stopped and reports it, and its
        job runs the step again elsewhere, under the same identity. How many were told."""
        runs = list(self._runs.values())
        for run in runs:
            run.cancel(removing=False)
        for key in {(run.key.job_key, run.key.job_id) for run in runs}:
            for queued in self._queue.remove(key, runs):
                self._spawn(queued.execute())  # never started: settles stopped, no slot
        return len(runs)

    def enqueue_report(self, key: RunKey, report: StepReport) -> None:
        """A run's durable outcome, for its job."""
        self.outbox.put(key.job_key, key.job_id, report)

    # -- shutting down --------------------------------------------------------------------

    async def deactivate(self, within: float) -> None:
        """Shut down gracefully (the seed's deactivation): cancel every run and wait, up to
        `within` seconds in all, for its work and callbacks to end and for the writes under way
        to land (places of keys given back too), then close. Nothing settled meanwhile is
        written or reported: the steps stay Scheduled or Running for recovery."""
        self.closed = True
        self._queue.clear()
        for run in list(self._runs.values()):
            run.cancel(removing=False)
        deadline = asyncio.ensure_future(self.clock.sleep(within))
        try:
            await until_done(deadline, lambda: self._tasks)  # the runs, and their work
            await until_done(deadline, lambda: self.writers.flushing() + self.keys.giving_back())
        finally:
            deadline.cancel()
        await self.close()

    async def close(self) -> None:
        """Deactivate at once (the host dies): cancel every run, wait for nothing, write and
        report nothing more."""
        self.closed = True
        self._queue.clear()
        self.writers.close()
        self.keys.close()
        for run in list(self._runs.values()):
            run.closed = True
            if run.runner is not None:
                run.runner.cancel()
        self._runs.clear()
        self.sync_runner.close()
