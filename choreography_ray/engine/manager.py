"""The jobs manager of one (scope, namespace): the door to its jobs, their activations and
their housekeeping (dead-job cleanup, retention, rehydration).

Activations are created on demand from storage and let go when a job finishes or can no longer
trust its copy of the record; the next call activates the job again from storage.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ..jobs.errors import (
    ChoreographyError,
    JobNotFoundError,
    OwnedElsewhereError,
    ResumeJobSuccess,
    ShuttingDownError,
    UnknownTypeError,
    VersionConflictError,
)
from ..jobs.job import Job
from ..jobs.registry import TypeKind
from ..jobs.state import JobState
from ..jobs.status import (
    PREPARING_JOB_STATUSES,
    RUNNING_JOB_STATUSES,
    STOP_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobStatus,
)
from ..storage.protocols import JobQuery
from .context import EngineContext
from .job import JobActivation, JobStartResult
from .messages import StepReport

_WAIT_POLL = 0.25
"""How often `wait_finished` reads a job that another host runs."""

log = logging.getLogger("choreography_ray.engine")

INTERRUPTED_STATUSES = RUNNING_JOB_STATUSES | STOP_STATUSES


@dataclass
class CleanupReport:
    dead_jobs_removed: list[str] = field(default_factory=list)
    terminal_jobs_removed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class RehydrationReport:
    queued: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    finished_stops: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class JobsManager:
    """Starts, stops, resumes, removes, lists and recovers the jobs of one partition."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        self._activations: dict[str, JobActivation] = {}
        self._activating: dict[str, asyncio.Future[JobActivation]] = {}
        self._rehydration: asyncio.Task[RehydrationReport] | None = None
        self._preparing: asyncio.Future[asyncio.Task[RehydrationReport]] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._recovering: set[str] = set()
        self._changed = asyncio.Event()
        """Set (and replaced) whenever a job of this manager is saved: wakes `wait_finished`."""
        self.writes = {"job_writes": 0, "step_batches": 0, "step_rows": 0}
        """Storage writes of the job activations this manager released (for benchmarks)."""

    # -- activations --------------------------------------------------------------------------

    @property
    def active_jobs(self) -> list[str]:
        return list(self._activations)

    def activation(self, job_id: str) -> JobActivation | None:
        return self._activations.get(job_id)

    def _released(self, activation: JobActivation) -> None:
        if self._activations.get(activation.id) is activation:
            del self._activations[activation.id]
        for name in ("job_writes", "step_batches", "step_rows"):
            self.writes[name] += getattr(activation.counters, name)
        if activation.release_reason and not self._closed and activation.id not in self._recovering:
            # It let go because storage failed it: bring it back from storage, with backoff.
            self._recovering.add(activation.id)
            task = asyncio.get_running_loop().create_task(self._recover_later(activation.id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _recover_later(self, job_id: str) -> None:
        """One chain of attempts per job, backing off from `step_delivery_retry_delay`."""
        options = self.ctx.options
        delay = options.step_delivery_retry_delay.total_seconds()
        try:
            for _ in range(options.step_delivery_max_attempts):
                await self.ctx.clock.sleep(delay)
                live = self._activations.get(job_id)
                if self._closed or (live is not None and not live.released):
                    return
                try:
                    state = await self.ctx.storage.jobs.find(job_id)
                    if state is None or state.status not in INTERRUPTED_STATUSES:
                        return
                    report = RehydrationReport()
                    await self._recover(job_id, report)
                    live = self._activations.get(job_id)
                    if live is not None and not live.released:
                        return
                except Exception as error:
                    log.warning(
                        "job %s: recovery after a storage failure failed: %s", job_id, error
                    )
                delay = min(options.max_step_delivery_retry_delay.total_seconds(), delay * 2)
            log.warning(
                "job %s: gave up recovering it after a storage failure; rehydration or a "
                "restart will pick it up",
                job_id,
            )
        finally:
            self._recovering.discard(job_id)

    def _job_class(self, type_name: str) -> type[Job[Any]]:
        return self.ctx.registry.resolve(type_name, TypeKind.JOB)  # type: ignore[return-value]

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

    async def activate(self, job_id: str) -> JobActivation:
        """The live activation of a job, loading it from storage when it has none."""
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

    # -- operations -----------------------------------------------------------------------------

    async def start(
        self, job_type: type[Job[Any]], request: BaseModel, *, job_id: str | None = None
    ) -> JobStartResult:
        """Start a job. With a caller-supplied `job_id`, starting it again returns that job."""
        if not (isinstance(job_type, type) and issubclass(job_type, Job)) or not hasattr(
            job_type, "name"
        ):
            raise TypeError(f"{job_type!r} is not a Job class with a request type")
        if not isinstance(request, job_type.request_type):
            raise TypeError(
                f"{job_type.__qualname__} takes a {job_type.request_type.__qualname__} "
                f"request, got {type(request).__qualname__}"
            )
        job_id = job_id or uuid.uuid4().hex
        existing = self._activations.get(job_id)
        if existing is None:
            stored = await self.ctx.storage.jobs.find(job_id)
            if stored is not None:
                activation = self._new_activation(stored)
                return await activation.start(request)
        else:
            return await existing.start(request)
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
        return await activation.start(request)

    async def get(self, job_id: str) -> JobState:
        live = self._activations.get(job_id)
        if live is not None and not live.released:
            return await live.snapshot()
        state = await self.ctx.storage.jobs.find(job_id)
        if state is None:
            raise JobNotFoundError(job_id)
        return state

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
        return await self.ctx.storage.jobs.query(query or JobQuery())

    async def stop(self, job_id: str) -> None:
        activation = await self.activate(job_id)
        await activation.stop()

    async def resume(self, job_id: str) -> ResumeJobSuccess:
        activation = await self.activate(job_id)
        return await activation.resume()

    async def remove(self, job_id: str) -> None:
        activation = await self.activate(job_id)
        await activation.remove()

    async def deliver(self, job_id: str, reports: Sequence[StepReport]) -> None:
        """Outcomes from a worker. A job whose activation is gone is activated and recounted."""
        live = self._activations.get(job_id)
        if live is None or live.released:
            try:
                live = await self.activate(job_id)
            except JobNotFoundError:
                log.info("outcomes for job %s, which no longer exists, were dropped", job_id)
                return
            if live.state.status in RUNNING_JOB_STATUSES:
                try:
                    await live.resume(recovering=True)
                except ChoreographyError as error:
                    log.warning("job %s could not be recovered for a report: %s", job_id, error)
        live.deliver(reports)

    # -- cleanup ------------------------------------------------------------------------------

    async def cleanup(self) -> CleanupReport:
        """Dead-job cleanup, then terminal retention; a failure in one never stops the other."""
        report = CleanupReport()
        try:
            await self.cleanup_dead_jobs(report)
        except Exception as error:
            log.exception("dead-job cleanup failed")
            report.errors.append(f"dead-job cleanup: {error}")
        try:
            await self.cleanup_terminal_jobs(report)
        except Exception as error:
            log.exception("terminal-job cleanup failed")
            report.errors.append(f"terminal-job cleanup: {error}")
        return report

    async def cleanup_dead_jobs(self, report: CleanupReport | None = None) -> list[str]:
        """Remove preparing jobs older than the threshold that stored no step and no plan."""
        report = report or CleanupReport()
        options = self.ctx.options
        before = self.ctx.clock.now() - options.dead_job_threshold
        candidates = await self.ctx.storage.jobs.query(
            JobQuery(
                statuses=PREPARING_JOB_STATUSES,
                created_before=before,
                take=options.max_terminal_jobs_per_cleanup,
            )
        )
        limit = asyncio.Semaphore(options.max_concurrent_cleanup)

        async def reap(job: JobState) -> None:
            async with limit:
                if job.plan is not None or job.has_stored_step_plan or job.id in self._activations:
                    return
                try:
                    if await self.ctx.storage.steps.count_for_job(job.id) != 0:
                        return
                    if await self.ctx.storage.jobs.remove(job.id):
                        report.dead_jobs_removed.append(job.id)
                except Exception as error:
                    log.exception("could not clean up dead job %s", job.id)
                    report.errors.append(f"{job.id}: {error}")

        await asyncio.gather(*(reap(job) for job in candidates))
        return report.dead_jobs_removed

    async def cleanup_terminal_jobs(self, report: CleanupReport | None = None) -> list[str]:
        """Remove completed and failed jobs older than the retention, steps first."""
        report = report or CleanupReport()
        options = self.ctx.options
        if options.terminal_job_retention is None:
            return []
        before = self.ctx.clock.now() - options.terminal_job_retention
        expired = await self.ctx.storage.jobs.query(
            JobQuery(
                statuses=TERMINAL_JOB_STATUSES,
                created_before=before,
                take=options.max_terminal_jobs_per_cleanup,
            )
        )
        limit = asyncio.Semaphore(options.max_concurrent_cleanup)

        async def expire(job: JobState) -> None:
            async with limit:
                try:
                    await self.ctx.storage.steps.remove_all_for_job(job.id)
                    if not await self.ctx.storage.jobs.remove_terminal(job.id):
                        log.info("job %s was not removed: it is no longer terminal", job.id)
                        return
                    if job.stored_step_plan_incarnation is not None and self.ctx.storage.plans:
                        await self.ctx.storage.plans.delete_plan(
                            job.id, job.stored_step_plan_incarnation
                        )
                    report.terminal_jobs_removed.append(job.id)
                except Exception as error:
                    log.exception("could not remove expired job %s", job.id)
                    report.errors.append(f"{job.id}: {error}")

        await asyncio.gather(*(expire(job) for job in expired))
        return report.terminal_jobs_removed

    async def run_cleanup(self, stopped: asyncio.Event) -> None:
        """Clean up every `cleanup_cadence` until `stopped` is set; survives every failure."""
        cadence = self.ctx.options.cleanup_cadence.total_seconds()
        while not stopped.is_set():
            await self.ctx.clock.sleep(cadence)
            if stopped.is_set():
                return
            await self.cleanup()

    # -- rehydration ----------------------------------------------------------------------------

    async def rehydrate(self) -> asyncio.Task[RehydrationReport]:
        """Clean up, load every interrupted job, and resume them in the background.

        Returns once the jobs are loaded, before they resume; the returned task ends when the
        drain does. An overlapping call shares the drain under way.
        """
        if self._closed:
            raise ShuttingDownError("the jobs manager has shut down; rehydration did not run")
        if self._rehydration is not None and not self._rehydration.done():
            return self._rehydration
        if self._preparing is not None:
            return await asyncio.shield(self._preparing)
        preparing = self._preparing = asyncio.get_running_loop().create_future()
        try:
            await self.cleanup()
            interrupted = await self.ctx.storage.jobs.get_jobs_excluding_finalized_stops(
                INTERRUPTED_STATUSES
            )
            interrupted.sort(key=lambda job: (job.created, job.id))
            self._rehydration = asyncio.get_running_loop().create_task(self._drain(interrupted))
            preparing.set_result(self._rehydration)
            return self._rehydration
        except BaseException as error:
            preparing.set_exception(error)
            preparing.exception()  # retrieved: callers that share it get it through shield
            raise
        finally:
            self._preparing = None

    async def _drain(self, jobs: list[JobState]) -> RehydrationReport:
        report = RehydrationReport(queued=[job.id for job in jobs])
        limit = asyncio.Semaphore(self.ctx.options.max_concurrent_rehydration)

        async def recover(job: JobState) -> None:
            async with limit:
                if self._closed:
                    return  # the host stopped: the job stays in storage for the next pass
                try:
                    await self._recover(job.id, report)
                except Exception as error:
                    log.warning("job %s could not be recovered: %s", job.id, error)
                    report.failed.append(job.id)

        await asyncio.gather(*(recover(job) for job in jobs))
        return report

    async def _recover(self, job_id: str, report: RehydrationReport) -> None:
        # Re-read at dispatch: a stop issued while the job waited in the queue wins.
        current = await self.ctx.storage.jobs.find(job_id)
        if (
            current is None
            or current.status not in INTERRUPTED_STATUSES
            or (current.status == JobStatus.STOPPED and current.stop_finalized)
        ):
            report.skipped.append(job_id)
            return
        if not self.ctx.registry.knows(current.type, TypeKind.JOB):
            raise UnknownTypeError(current.type, "job")
        live = self._activations.get(job_id)
        if live is not None and not live.released and (live._tracked or live._waiting):
            report.skipped.append(job_id)
            return
        activation = await self.activate(job_id)
        if current.status in STOP_STATUSES:
            await activation.finish_stop()
            report.finished_stops.append(job_id)
            return
        await activation.resume(recovering=True)
        report.resumed.append(job_id)

    # -- shutdown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop background recovery; activations are dropped without writing anything."""
        self._closed = True
        if self._rehydration is not None:
            self._rehydration.cancel()
        for task in list(self._tasks):
            task.cancel()
        for activation in list(self._activations.values()):
            activation.released = True
            for task in list(activation._background):
                task.cancel()
        self._activations.clear()

    @property
    def busy(self) -> bool:
        return bool(self._activating) or any(a.busy for a in self._activations.values())


__all__ = ["CleanupReport", "JobsManager", "RehydrationReport"]
