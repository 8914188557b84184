"""Housekeeping of one partition: dead-job cleanup, terminal-job retention and stored plans
that no job needs any more.

A round is bounded (`max_terminal_jobs_per_cleanup` jobs, `max_concurrent_cleanup` at once) and
each part is isolated from the other's failure; rounds run every `cleanup_cadence` once
scheduled, through the injectable clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from ..jobs.state import JobState
from ..jobs.status import PREPARING_JOB_STATUSES, TERMINAL_JOB_STATUSES, JobStatus
from ..storage.protocols import JobQuery
from .context import EngineContext

log = logging.getLogger("choreography_ray.engine")


@dataclass
class CleanupReport:
    dead_jobs_removed: list[str] = field(default_factory=list)
    terminal_jobs_removed: list[str] = field(default_factory=list)
    plans_removed: list[tuple[str, int]] = field(default_factory=list)
    """(job id, incarnation) of stored plans no job needs any more."""
    errors: list[str] = field(default_factory=list)


class Cleanup:
    """Removes dead and expired jobs, on demand or every `cleanup_cadence`."""

    def __init__(self, ctx: EngineContext, is_active: Callable[[str], bool]) -> None:
        self.ctx = ctx
        self._is_active = is_active
        """Whether a job has an activation here (a dead-looking job being started is not dead)."""
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> CleanupReport:
        """Dead-job cleanup, then terminal retention; a failure in one never stops the other."""
        report = CleanupReport()
        try:
            await self.dead_jobs(report)
        except Exception as error:
            log.exception("dead-job cleanup failed")
            report.errors.append(f"dead-job cleanup: {error}")
        try:
            await self.terminal_jobs(report)
        except Exception as error:
            log.exception("terminal-job cleanup failed")
            report.errors.append(f"terminal-job cleanup: {error}")
        try:
            await self.orphaned_plans(report)
        except Exception as error:
            log.exception("plan cleanup failed")
            report.errors.append(f"plan cleanup: {error}")
        return report

    async def dead_jobs(self, report: CleanupReport | None = None) -> list[str]:
        """Remove preparing jobs older than the threshold that stored no step and no plan."""
        report = report or CleanupReport()
        storage = self.ctx.storage

        async def reap(job: JobState) -> None:
            if job.plan is not None or job.has_stored_step_plan or self._is_active(job.id):
                return
            if await storage.steps.count_for_job(job.id) != 0:
                return
            if await storage.jobs.remove(job.id):
                report.dead_jobs_removed.append(job.id)

        before = self.ctx.clock.now() - self.ctx.options.dead_job_threshold
        await self._each(PREPARING_JOB_STATUSES, before, reap, report, "clean up dead job")
        return report.dead_jobs_removed

    async def terminal_jobs(self, report: CleanupReport | None = None) -> list[str]:
        """Remove completed and failed jobs older than the retention, steps first."""
        report = report or CleanupReport()
        retention = self.ctx.options.terminal_job_retention
        if retention is None:
            return []
        storage = self.ctx.storage

        async def expire(job: JobState) -> None:
            await storage.steps.remove_all_for_job(job.id)
            if not await storage.jobs.remove_terminal(job.id):
                log.info("job %s was not removed: it is no longer terminal", job.id)
                return
            if job.stored_step_plan_incarnation is not None and storage.plans:
                await storage.plans.delete_plan(job.id, job.stored_step_plan_incarnation)
            report.terminal_jobs_removed.append(job.id)

        before = self.ctx.clock.now() - retention
        await self._each(TERMINAL_JOB_STATUSES, before, expire, report, "remove expired job")
        return report.terminal_jobs_removed

    async def orphaned_plans(self, report: CleanupReport | None = None) -> list[tuple[str, int]]:
        """Delete stored plans no job needs: its job is gone, durably terminal or a finalized
        stop, or it is an incarnation older than the one the job records. Each plan read is
        deleted by its own incarnation only, so a plan saved meanwhile is never touched (a
        job records its new incarnation before it saves that plan). Bounded like the rest."""
        report = report or CleanupReport()
        storage = self.ctx.storage
        if storage.plans is None:
            return []
        plans = storage.plans
        stored = await plans.stored_plans(self.ctx.options.max_terminal_jobs_per_cleanup)
        for job_id, incarnation in stored:
            if self._is_active(job_id):
                continue
            job = await storage.jobs.find(job_id)
            if job is not None and not (
                job.status.is_terminal
                or (job.status == JobStatus.STOPPED and job.stop_finalized)
                or (
                    job.stored_step_plan_incarnation is not None
                    and incarnation < job.stored_step_plan_incarnation
                )
            ):
                continue
            try:
                await plans.delete_plan(job_id, incarnation)
            except Exception as error:
                log.exception("could not delete plan %s of job %s", incarnation, job_id)
                report.errors.append(f"{job_id}: plan {incarnation}: {error}")
                continue
            report.plans_removed.append((job_id, incarnation))
        return report.plans_removed

    async def _each(
        self,
        statuses: frozenset[JobStatus],
        before: datetime,
        action: Callable[[JobState], Awaitable[None]],
        report: CleanupReport,
        what: str,
    ) -> None:
        """`action` on each job in `statuses` created before `before`: at most
        `max_terminal_jobs_per_cleanup` jobs, `max_concurrent_cleanup` at once, a failure on
        one job logged and reported without stopping the others."""
        options = self.ctx.options
        jobs = await self.ctx.storage.jobs.query(
            JobQuery(
                statuses=statuses, created_before=before, take=options.max_terminal_jobs_per_cleanup
            )
        )
        limit = asyncio.Semaphore(options.max_concurrent_cleanup)

        async def one(job: JobState) -> None:
            async with limit:
                try:
                    await action(job)
                except Exception as error:
                    log.exception("could not %s %s", what, job.id)
                    report.errors.append(f"{job.id}: {error}")

        await asyncio.gather(*(one(job) for job in jobs))

    def schedule(self) -> None:
        """Clean up every `cleanup_cadence` until the manager closes (once per manager).

        Each round is bounded (`max_terminal_jobs_per_cleanup`, `max_concurrent_cleanup`) and
        isolated (`run` catches each part's failure): a failing round is logged and the
        next one runs on time. `close` cancels it.
        """
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._periodically())

    async def _periodically(self) -> None:
        cadence = self.ctx.options.cleanup_cadence.total_seconds()
        while True:
            await self.ctx.clock.sleep(cadence)
            report = await self.run()
            if report.errors:
                log.warning(
                    "cleanup: %d error(s); trying again in %ss", len(report.errors), cadence
                )

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
