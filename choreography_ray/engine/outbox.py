"""A worker's outbox: durable outcomes on their way to their jobs, in batches per job.

An outcome is reported only once it is durable (the run's write completed). Sends do not wait
for one another: at most `MAX_DELIVERIES` are in flight, and outcomes queued meanwhile go in
the next batch, so a busy controller's slow answers hold nothing back. A failed send is retried
with backoff; a removal's report goes on until the job hears it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..jobs.options import JobsOptions
from ..jobs.retry import Backoff
from ..jobs.state import JobKey
from ..jobs.status import JobStepStatus
from ..storage.protocols import JobsStorage
from .clock import Clock
from .messages import StepReport
from .ports import JobReporter

log = logging.getLogger("choreography_ray.engine")

MAX_DELIVERIES = 8
"""Report sends in flight at once, per worker."""


class Outbox:
    """Batches a worker's reports per job and delivers them."""

    def __init__(
        self,
        reporter: JobReporter,
        options: JobsOptions,
        clock: Clock,
        closed: Callable[[], bool],
        storage_for: Callable[[JobKey], JobsStorage] | None = None,
    ) -> None:
        """`closed` says whether the worker shuts down: delivery then stops retrying.
        `storage_for` gives the step storage where a removed step's record is deleted."""
        self.reporter = reporter
        self.options = options
        self.clock = clock
        self._closed = closed
        self._storage_for = storage_for
        self._reports: dict[tuple[JobKey, str], list[StepReport]] = {}
        self._task: asyncio.Task[None] | None = None
        self._deliveries: set[asyncio.Task[None]] = set()
        self._backing_off = 0
        """Deliveries waiting out a retry's backoff on the clock: they do not move by themselves."""

    @property
    def busy(self) -> bool:
        """Reports queued or on their way (a delivery waiting out a backoff is not moving)."""
        return bool(
            self._reports
            or (self._task is not None and not self._task.done())
            or len(self._deliveries) > self._backing_off
        )

    def put(self, job_key: JobKey, job_id: str, report: StepReport) -> None:
        """Queue a durable outcome for its job."""
        self._reports.setdefault((job_key, job_id), []).append(report)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        """Send what is queued, without waiting for earlier sends to be answered."""
        await asyncio.sleep(0)
        while self._reports:
            while len(self._deliveries) >= MAX_DELIVERIES:
                await asyncio.wait(self._deliveries, return_when=asyncio.FIRST_COMPLETED)
            batches, self._reports = self._reports, {}
            loop = asyncio.get_running_loop()
            for (key, job_id), reports in batches.items():
                task = loop.create_task(self._deliver(key, job_id, reports))
                self._deliveries.add(task)
                task.add_done_callback(self._deliveries.discard)

    async def _deliver(self, key: JobKey, job_id: str, reports: list[StepReport]) -> None:
        """Send a batch, retrying with backoff. A removal's report is not bounded by
        `step_delivery_max_attempts`: it goes on while the worker lives, until the job hears
        it (a job that no longer exists answers that there is nothing left to report)."""
        backoff = Backoff.between(
            self.options.step_delivery_retry_delay, self.options.max_step_delivery_retry_delay
        )
        limit: int | None = self.options.step_delivery_max_attempts
        if any(report.status == JobStepStatus.REMOVING for report in reports):
            limit = None
        attempt = 0
        while not self._closed():
            attempt += 1
            try:
                await self.reporter.report(key, job_id, reports)
            except Exception as error:
                if attempt == limit:
                    log.warning(
                        "gave up reporting %d outcome(s) to job %s: %s; they are in storage "
                        "for the job to recount",
                        len(reports),
                        job_id,
                        error,
                    )
                    return
                delay = backoff.next()
                log.info("report to job %s failed (%s); retrying in %.1fs", job_id, error, delay)
                self._backing_off += 1
                try:
                    await self.clock.sleep(delay)
                finally:
                    self._backing_off -= 1
            else:
                await self._delivered(key, job_id, reports)
                return

    async def _delivered(self, job_key: JobKey, job_id: str, reports: list[StepReport]) -> None:
        """The job accepted these reports: a step being removed deletes its own record now
        that its job stored its stop (the recovery seed). Until then the record stays and the
        stop is reported again; the job deletes whatever is left once it is cleared."""
        removed = [r.step_id for r in reports if r.status == JobStepStatus.REMOVING]
        if not removed or self._storage_for is None:
            return
        steps = self._storage_for(job_key).steps
        for step_id in removed:
            try:
                await steps.remove(job_id, step_id)
            except Exception as error:  # the job's clearing deletes it
                log.warning("step %s of job %s kept its record: %s", step_id, job_id, error)
