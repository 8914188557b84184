"""Rehydration: bringing back the interrupted jobs of one jobs manager.

After a host or the cluster restarts, every job left Running or mid-stop in storage is loaded
and resumed (or its stop finished), the highest effective priority first, then the oldest
(`engine.priority.activation_order`), at most `max_concurrent_rehydration` at once.
After a storage failure let one job go, the job is brought back alone, with backoff. Every
recovery is counted on the job first, and a job recovery gave up on (quarantined, see
`engine.quarantine`) is left alone by all three paths.

This is policy over the manager's public door (`activate`, `live`, `cleanup`); the engine does
not import it: the manager is handed a `Rehydration` (see `JobsManager(recovery=...)`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..engine.job import JobActivation
from ..engine.manager import INTERRUPTED_STATUSES, JobsManager
from ..engine.priority import activation_order
from ..jobs.errors import (
    ChoreographyError,
    JobNotFoundError,
    JobQuarantinedError,
    OwnedElsewhereError,
    UnknownTypeError,
)
from ..jobs.registry import TypeKind
from ..jobs.retry import Backoff
from ..jobs.state import JobState
from ..jobs.status import RUNNING_JOB_STATUSES, STOP_STATUSES, JobStatus

log = logging.getLogger("choreography_ray.recovery")


@dataclass
class RehydrationReport:
    queued: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    finished_stops: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    """Jobs left alone because recovery gave up on them (or gave up now)."""


class Rehydration:
    """Recovery of one manager's jobs: all interrupted ones, or one a storage failure let go."""

    def __init__(self, manager: JobsManager) -> None:
        self.manager = manager
        self.ctx = manager.ctx
        self._drain: asyncio.Task[RehydrationReport] | None = None
        self._preparing: asyncio.Future[asyncio.Task[RehydrationReport]] | None = None
        self._recovering: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def rehydrate(self) -> asyncio.Task[RehydrationReport]:
        """Clean up, load every interrupted job, and resume them in the background.

        Returns once the jobs are loaded, before they resume; the returned task ends when the
        drain does. An overlapping call shares the drain under way.
        """
        if self._drain is not None and not self._drain.done():
            return self._drain
        if self._preparing is not None:
            return await asyncio.shield(self._preparing)
        preparing = self._preparing = asyncio.get_running_loop().create_future()
        try:
            await self.manager.cleanup.run()
            interrupted = await self.ctx.storage.jobs.get_jobs_excluding_finalized_stops(
                INTERRUPTED_STATUSES
            )
            interrupted = activation_order(
                interrupted, self.ctx.clock.now(), self.ctx.options.priority_aging
            )
            self._drain = asyncio.get_running_loop().create_task(self._recover_all(interrupted))
            preparing.set_result(self._drain)
            return self._drain
        except BaseException as error:
            preparing.set_exception(error)
            preparing.exception()  # retrieved: callers that share it get it through shield
            raise
        finally:
            self._preparing = None

    async def _recover_all(self, jobs: list[JobState]) -> RehydrationReport:
        report = RehydrationReport(queued=[job.id for job in jobs])
        limit = asyncio.Semaphore(self.ctx.options.max_concurrent_rehydration)

        async def recover(job: JobState) -> None:
            async with limit:
                if self.manager.closed:
                    return  # the host stopped: the job stays in storage for the next pass
                try:
                    await self._recover(job.id, report)
                except OwnedElsewhereError:
                    report.skipped.append(job.id)  # a live controller host runs it
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
        live = self.manager.live(job_id)
        if live is not None and live.has_work:
            report.skipped.append(job_id)
            return
        stop = current.status in STOP_STATUSES
        try:  # a quarantined job is refused here, before anything is claimed or counted
            activation = await self.manager.activate(job_id, recovering=True)
            recovery = (
                activation.finish_stop if stop else partial(activation.resume, recovering=True)
            )
            await self.manager.attempts.run(activation, recovery)
        except JobQuarantinedError as error:
            log.warning("job %s is not recovered: %s", job_id, error)
            report.quarantined.append(job_id)
            return
        (report.finished_stops if stop else report.resumed).append(job_id)

    async def reconcile(self) -> RehydrationReport:
        """The reconciliation sweep: every unfinished job of the partition that no live
        activation holds — its owner's ownership lease expired, or it never had one and its
        owner is gone — is claimed and resumed (or its stop finished) here.

        It costs one query of the partition's unfinished jobs; a job whose lease holds is not
        touched. It closes the seed's known gap: a job whose Running write was acknowledged
        to no one, or whose activation was lost while its host lives, is resumed within one
        lease plus one sweep interval instead of waiting for a restart."""
        report = RehydrationReport()
        now = self.ctx.clock.now()
        jobs = await self.ctx.storage.jobs.get_jobs_excluding_finalized_stops(INTERRUPTED_STATUSES)
        for job in activation_order(jobs, now, self.ctx.options.priority_aging):
            owner = job.owner
            if self.manager.live(job.id) is not None or (
                owner is not None and owner.lease_expires is not None and owner.lease_expires > now
            ):
                continue  # held by a live activation, here or elsewhere
            if job.quarantine is not None:
                continue  # recovery gave up on it: an explicit resume takes it up
            report.queued.append(job.id)
            if self.manager.closed:
                break
            try:
                await self._recover(job.id, report)
            except OwnedElsewhereError:
                report.skipped.append(job.id)  # an owner without a lease that still answers
            except Exception as error:
                log.warning("job %s could not be reconciled: %s", job.id, error)
                report.failed.append(job.id)
        if report.resumed or report.finished_stops:
            log.warning(
                "the reconciliation sweep took over %d job(s) that no live activation held: %s",
                len(report.resumed) + len(report.finished_stops),
                ", ".join([*report.resumed, *report.finished_stops]),
            )
        return report

    async def recover_now(self, job_id: str) -> JobActivation | None:
        """Bring back a job no activation here holds — a worker reported for it, another
        controller host handed it over — counted as a recovery (a report may be what
        activates a poison job). None, logged, when it cannot be: its outcomes are stored,
        and its next recovery counts them. `OwnedElsewhereError` when another live host runs
        it: the caller sends there."""
        try:
            live = await self.manager.activate(job_id, recovering=True)
            if live.state.status in RUNNING_JOB_STATUSES:
                await self.manager.attempts.run(live, partial(live.resume, recovering=True))
            return live
        except OwnedElsewhereError:
            raise
        except JobNotFoundError:
            log.info("job %s no longer exists; its outcomes were dropped", job_id)
        except ChoreographyError as error:  # quarantined, refused, or its resume failed
            log.warning("job %s could not be recovered now: %s", job_id, error)
        return None

    def recover_later(self, job_id: str) -> None:
        """Bring back a job a storage failure let go: one chain of attempts per job."""
        if job_id in self._recovering:
            return
        self._recovering.add(job_id)
        task = asyncio.get_running_loop().create_task(self._recover_with_backoff(job_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recover_with_backoff(self, job_id: str) -> None:
        """Attempts backing off from `step_delivery_retry_delay`, until the job runs again."""
        options = self.ctx.options
        backoff = Backoff.between(
            options.step_delivery_retry_delay, options.max_step_delivery_retry_delay
        )
        try:
            for _ in range(options.step_delivery_max_attempts):
                await self.ctx.clock.sleep(backoff.next())
                if self.manager.closed or self.manager.live(job_id) is not None:
                    return
                try:
                    state = await self.ctx.storage.jobs.find(job_id)
                    if (
                        state is None
                        or state.status not in INTERRUPTED_STATUSES
                        or state.quarantine is not None
                    ):
                        return
                    await self._recover(job_id, RehydrationReport())
                    if self.manager.live(job_id) is not None:
                        return
                except Exception as error:
                    log.warning(
                        "job %s: recovery after a storage failure failed: %s", job_id, error
                    )
            log.warning(
                "job %s: gave up recovering it after a storage failure; rehydration or a "
                "restart will pick it up",
                job_id,
            )
        finally:
            self._recovering.discard(job_id)

    def close(self) -> None:
        """Stop every drain and attempt under way; jobs stay in storage for the next host."""
        if self._drain is not None:
            self._drain.cancel()
        for task in list(self._tasks):
            task.cancel()
