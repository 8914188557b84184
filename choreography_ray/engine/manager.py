"""The jobs manager of one (scope, namespace): the door to its jobs, their activations and
their housekeeping (dead-job cleanup and retention, every `cleanup_cadence`).

Activations are created on demand from storage and let go when a job finishes or can no longer
trust its copy of the record; the next call activates the job again from storage. Bringing
interrupted jobs back (rehydration) is recovery's policy (`choreography_ray.recovery`), handed
to the manager as a `Recovery`: the engine does not import it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from ..jobs.errors import (
    DrainJobResult,
    DrainOutcome,
    JobNotFoundError,
    OwnedElsewhereError,
    ResumeJobSuccess,
    ShuttingDownError,
    StartJobError,
    StorageUnavailableError,
    UnknownTypeError,
    VersionConflictError,
)
from ..jobs.job import Job, StepDetails, new_job_id
from ..jobs.registry import TypeKind
from ..jobs.state import JobOwner, JobState
from ..jobs.status import (
    RUNNING_JOB_STATUSES,
    STOP_STATUSES,
    JobStatus,
)
from ..storage.protocols import JobQuery, StepCounts
from .cleanup import Cleanup, CleanupReport
from .clock import within
from .context import EngineContext
from .job import JobActivation, JobStartResult
from .messages import StepReport
from .quarantine import RecoveryAttempts, refusal
from .starting import DEFAULT_START, StartSettings

T = TypeVar("T")

_WAIT_POLL = 0.25
"""How often `wait_finished` reads a job that another host runs."""

READ_SECONDS = 4.0
"""How long a reading call (`get`, `list`, `step_counts`) waits for storage: during an outage
it answers `StorageUnavailableError` within this bound, never behind a write that waits."""

log = logging.getLogger("choreography_ray.engine")

INTERRUPTED_STATUSES = RUNNING_JOB_STATUSES | STOP_STATUSES


class Recovery(Protocol):
    """What the manager asks of recovery (implemented by `recovery.Rehydration`)."""

    async def rehydrate(self) -> asyncio.Task[Any]:
        """Load the interrupted jobs and resume them; the task ends with the drain."""
        ...

    def recover_later(self, job_id: str) -> None:
        """Bring back a job that a storage failure let go."""
        ...

    async def recover_now(self, job_id: str) -> JobActivation | None:
        """Bring back a job no activation here holds (a report for it, a job handed over):
        its live activation once recovered; None, logged, when it cannot be recovered."""
        ...

    async def reconcile(self) -> Any:
        """Claim and resume the unfinished jobs that no live activation holds."""
        ...

    def close(self) -> None: ...


RecoveryFactory = Callable[["JobsManager"], Recovery]


class JobsManager:
    """Starts, stops, resumes, removes and lists the jobs of one partition, and cleans up."""

    def __init__(self, ctx: EngineContext, *, recovery: RecoveryFactory) -> None:
        """`recovery` is handed in (usually `recovery.Rehydration`): the engine never imports
        recovery, whose policy sits above it."""
        self.ctx = ctx
        self._activations: dict[str, JobActivation] = {}
        self._activating: dict[str, asyncio.Future[JobActivation]] = {}
        self._closed = False
        self._recovery = recovery(self)
        self.attempts = RecoveryAttempts()
        """Every recovery of a job here is counted by it first (poison jobs, `quarantine`)."""
        self.cleanup = Cleanup(ctx, self._activations.__contains__)
        """Dead-job cleanup and terminal retention (`run`, `dead_jobs`, `terminal_jobs`)."""
        self._changed = asyncio.Event()
        """Set (and replaced) whenever a job of this manager is saved: wakes `wait_finished`."""
        self.writes = {"job_writes": 0, "step_batches": 0, "step_rows": 0}
        """Storage writes of the job activations this manager released (for benchmarks)."""

    # -- activations --------------------------------------------------------------------------

    @property
    def active_jobs(self) -> list[str]:
        return list(self._activations)

    @property
    def outstanding_steps(self) -> int:
        """Steps of the running jobs here with no outcome yet (the autoscaler's demand)."""
        return sum(activation.outstanding for activation in self._activations.values())

    def activation(self, job_id: str) -> JobActivation | None:
        return self._activations.get(job_id)

    def live(self, job_id: str) -> JobActivation | None:
        """The job's activation here, unless it has let the job go."""
        live = self._activations.get(job_id)
        return live if live is not None and not live.released else None

    @property
    def closed(self) -> bool:
        return self._closed

    def _released(self, activation: JobActivation) -> None:
        if self._activations.get(activation.id) is activation:
            del self._activations[activation.id]
        counters = activation.counters
        self.writes["job_writes"] += counters.job_writes
        self.writes["step_batches"] += counters.step_batches
        self.writes["step_rows"] += counters.step_rows
        if activation.release_reason and not self._closed:
            # It let go because storage failed it: bring it back from storage, with backoff.
            self._recovery.recover_later(activation.id)

    def _job_class(self, type_name: str) -> type[Job[Any]]:
        return self.ctx.registry.resolve(type_name, TypeKind.JOB)

    def _new_activation(self, state: JobState) -> JobActivation:
        activation = JobActivation(
            self.ctx,
            self._job_class(state.type),
            state,
            on_release=self._released,
            on_saved=self._saved,
        )
        self._activations[state.id] = activation
        return activation

    async def activate(self, job_id: str, *, recovering: bool = False) -> JobActivation:
        """The live activation of a job, loading it from storage when it has none. For
        `recovering` (recovery, a worker's report) a quarantined job is refused, unclaimed."""
        live = self._activations.get(job_id)
        if live is not None and not live.released:
            return live
        pending = self._activating.get(job_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[JobActivation] = asyncio.get_running_loop().create_future()
        self._activating[job_id] = future
        try:
            state = await self.ctx.storage.jobs.find(job_id)
            if state is None:
                raise JobNotFoundError(job_id)
            refused = refusal(state) if recovering else None
            if refused is not None:
                raise refused
            if self.ctx.owner is not None:
                state = await self._claim(state)
            activation = self._new_activation(state)
            future.set_result(activation)
            return activation
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: waiters get it through shield
            raise
        finally:
            del self._activating[job_id]

    async def _claim(self, state: JobState) -> JobState:
        """Make this host the job's one owner, by compare-and-set on the job record.

        A job owned by another host that still runs is not taken: the caller is told where it
        lives. A job whose owner is gone is taken over.
        """
        me = self.ctx.owner
        assert me is not None
        for _ in range(3):
            current = state.owner
            if current is not None and (current.host, current.activation_epoch) == (
                me.host,
                me.activation_epoch,
            ):
                return state
            if (
                current is not None
                and not self._lease_expired(current)
                and self.ctx.owner_alive is not None
                and await self.ctx.owner_alive(current)
            ):
                raise OwnedElsewhereError(state.id, current.host, current.activation_epoch)
            if state.status.is_terminal:
                return state  # nothing will run: no need to own it
            state.owner = me
            try:
                state.version = await self.ctx.storage.jobs.save(state)
                return state
            except VersionConflictError:
                fresh = await self.ctx.storage.jobs.find(state.id)
                if fresh is None:
                    raise JobNotFoundError(state.id) from None
                state = fresh
        raise OwnedElsewhereError(state.id, state.owner.host if state.owner else "", 0)

    def _lease_expired(self, owner: JobOwner) -> bool:
        """An owner whose lease ran out holds no live activation of the job (a live one renews
        it), even when its host still answers: the job is taken over."""
        return owner.lease_expires is not None and owner.lease_expires <= self.ctx.clock.now()

    # -- operations -----------------------------------------------------------------------------

    async def start(
        self,
        job_type: type[Job[Any]],
        request: BaseModel,
        *,
        job_id: str | None = None,
        steps: Iterable[StepDetails] | None = None,
        max_active_steps: int | None = None,
        settings: StartSettings = DEFAULT_START,
    ) -> JobStartResult:
        """Start a job (its `job_id` again: that job); `steps` stand in for `prepare_steps`;
        `settings`: its priority and concurrency key, else the class's."""
        is_job = isinstance(job_type, type) and issubclass(job_type, Job)
        if not is_job or not hasattr(job_type, "name"):
            raise TypeError(f"{job_type!r} is not a Job class with a request type")
        if not isinstance(request, job_type.request_type):
            raise TypeError(
                f"{job_type.__qualname__} takes a {job_type.request_type.__qualname__} "
                f"request, got {type(request).__qualname__}"
            )
        job_id = job_id or new_job_id()
        existing = self._activations.get(job_id)
        if existing is None:
            stored = await self.ctx.storage.jobs.find(job_id)
            if stored is not None:
                # Starting an existing job answers what it is; the activation that answers
                # claims the job like any other (a start must not run a job another live host
                # owns, nor one whose owner is gone without taking it over).
                try:
                    activation = await self.activate(job_id)
                except OwnedElsewhereError:
                    refusal = (
                        StartJobError.ALREADY_COMPLETED
                        if stored.status.is_terminal
                        else StartJobError.ALREADY_BEEN_PREPARED
                    )
                    return JobStartResult(job_id, refusal)
                return await activation.start(request, steps, max_active_steps, settings)
        else:
            return await existing.start(request, steps, max_active_steps, settings)
        state = JobState(
            id=job_id,
            key=self.ctx.key,
            type=job_type.name,
            created=self.ctx.clock.now(),
            owner=self.ctx.owner,
        )
        activation = JobActivation(
            self.ctx, job_type, state, on_release=self._released, on_saved=self._saved
        )
        self._activations[job_id] = activation
        return await activation.start(request, steps, max_active_steps, settings)

    async def get(self, job_id: str) -> JobState:
        """The job as its live activation holds it between operations, else as stored."""
        live = self._activations.get(job_id)
        if live is not None and not live.released:
            state = live.peek()
            if state is not None:
                return state
        state = await self._read(self.ctx.storage.jobs.find(job_id), f"job {job_id}")
        if state is None:
            raise JobNotFoundError(job_id)
        return state

    async def _read(self, awaitable: Awaitable[T], what: str) -> T:
        try:
            return await within(self.ctx.clock, READ_SECONDS, awaitable)
        except TimeoutError:
            raise StorageUnavailableError(
                f"storage did not answer a read of {what} within {READ_SECONDS:g} s"
            ) from None

    async def step_counts(self, job_id: str) -> StepCounts:
        """The job's step records per status, with those that cannot be read counted apart:
        what step storage holds, whatever the job's own progress says."""
        await self.get(job_id)
        counts = self.ctx.storage.steps.count_by_status(job_id)
        return await self._read(counts, f"the steps of job {job_id}")

    async def wait_finished(self, job_id: str, within: float) -> JobState | None:
        """The job's state once it is finished (None once it was cleared), or its state as it
        stands when `within` seconds pass first.

        A job this manager runs wakes the wait as it is saved, so it returns as soon as the job
        finishes; a job run elsewhere is read again every `_WAIT_POLL` seconds.
        """
        clock = self.ctx.clock
        deadline = asyncio.ensure_future(clock.sleep(within))
        try:
            while True:
                changed = self._changed
                try:
                    state = await self.get(job_id)
                except JobNotFoundError:
                    return None
                if state.is_finished or deadline.done():
                    return state
                live = self._activations.get(job_id)
                waits = {asyncio.ensure_future(changed.wait()), deadline}
                if live is None or live.released:
                    waits.add(asyncio.ensure_future(clock.sleep(_WAIT_POLL)))
                _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for waiting in pending - {deadline}:
                    waiting.cancel()
        finally:
            deadline.cancel()

    def _saved(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def list(self, query: JobQuery | None = None) -> list[JobState]:
        found = self.ctx.storage.jobs.query(query or JobQuery())
        return await self._read(found, "the jobs")

    async def stop(self, job_id: str) -> None:
        await (await self.activate(job_id)).stop()

    async def drain(self, job_id: str, within: float | None = None) -> DrainOutcome:
        """Stop the job and wait, up to `within` seconds, for every step to answer."""
        try:
            activation = await self.activate(job_id)
        except JobNotFoundError:
            return DrainOutcome(DrainJobResult.NOT_FOUND)
        except UnknownTypeError:
            return DrainOutcome(DrainJobResult.UNKNOWN_JOB_TYPE)
        return await activation.drain(within)

    async def resume(self, job_id: str) -> ResumeJobSuccess:
        return await (await self.activate(job_id)).resume()

    async def remove(self, job_id: str) -> None:
        await (await self.activate(job_id)).remove()

    async def deliver(self, job_id: str, reports: Sequence[StepReport]) -> None:
        """Outcomes from a worker. A job whose activation is gone is activated and recounted.

        Reports to a job being removed are answered once counted, with an error when finishing
        the removal failed (the worker then reports again); any other report is queued."""
        live = self._activations.get(job_id)
        if live is None or live.released:
            live = await self._recovery.recover_now(job_id)
            if live is None:
                return  # the outcomes are stored: the job's recovery recounts them
        if live.state.status == JobStatus.REMOVING:
            await live.deliver_to_removal(reports)
            return
        live.deliver(reports)

    async def adopt(self, job_id: str) -> None:
        """A job another controller host handed over (its node drains): recover it here."""
        await self._recovery.recover_now(job_id)

    async def hand_over(self, job_id: str, owner: JobOwner) -> bool:
        """Give a live job to another controller host by compare-and-set (this host's node
        drains); False when it has no live activation here or the write lost."""
        live = self.live(job_id)
        return live is not None and await live.hand_over(owner)

    async def hosts_lost(self, hosts: frozenset[str]) -> int:
        """Worker hosts that are gone: every live activation sends their starts again (or, for
        a job being stopped, counts them stopped). Returns how many steps were affected."""
        return await self._each_live(lambda job: job.hosts_lost(hosts), "lost hosts")

    async def hosts_draining(self, hosts: frozenset[str]) -> int:
        """Worker hosts whose node Ray drains: every live activation moves its runs queued
        there to the others. Returns how many runs moved."""
        return await self._each_live(lambda job: job.hosts_draining(hosts), "draining hosts")

    async def workers_joined(self, hosts: frozenset[str]) -> int:
        """Worker hosts that joined: every live activation sends them work at once, moving a
        share of its queued runs. Returns how many runs moved."""
        return await self._each_live(lambda job: job.workers_joined(hosts), "joined hosts")

    async def _each_live(self, call: Callable[[JobActivation], Awaitable[int]], what: str) -> int:
        total = 0
        for activation in list(self._activations.values()):
            if activation.released:
                continue
            try:
                total += await call(activation)
            except Exception:
                log.exception("job %s: handling %s failed", activation.id, what)
        return total

    # -- recovery -------------------------------------------------------------------------------

    async def rehydrate(self) -> asyncio.Task[Any]:
        """Clean up, then bring back every interrupted job (see `recovery.Rehydration`); from
        then on clean up every `cleanup_cadence`. Returns once the jobs are loaded; the task
        ends when they all resumed and yields the rehydration's report."""
        if self._closed:
            raise ShuttingDownError("the jobs manager has shut down; rehydration did not run")
        self.cleanup.schedule()
        return await self._recovery.rehydrate()

    async def reconcile(self) -> Any:
        """One reconciliation sweep (see `recovery.Rehydration.reconcile`): unfinished jobs
        whose owner's lease expired are claimed and resumed here."""
        if self._closed:
            raise ShuttingDownError("the jobs manager has shut down; the sweep did not run")
        return await self._recovery.reconcile()

    # -- shutdown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop cleanup and recovery; activations are dropped without writing anything."""
        self._closed = True
        self.cleanup.close()
        self._recovery.close()
        for activation in list(self._activations.values()):
            activation.drop()
        self._activations.clear()

    @property
    def busy(self) -> bool:
        return bool(self._activating) or any(a.busy for a in self._activations.values())


__all__ = ["INTERRUPTED_STATUSES", "CleanupReport", "JobsManager", "Recovery", "RecoveryFactory"]
