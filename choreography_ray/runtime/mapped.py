"""What `jobs.map` answers: the map job's id, and its outcome as a map's caller reads it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..jobs.state import JobState

if TYPE_CHECKING:
    from .async_client import AsyncJobs


class AsyncMapped:
    """A started map job, as coroutines: `job_id`, `wait()`."""

    def __init__(self, jobs: AsyncJobs, job_id: str, *, scope: str, namespace: str) -> None:
        self.jobs = jobs
        self.job_id = job_id
        self.scope = scope
        self.namespace = namespace

    async def wait(self, *, timeout: float | None = None) -> JobState | None:  # noqa: ASYNC109
        """Wait until the job is finished (see `AsyncJobs.wait`)."""
        return await self.jobs.wait(
            self.job_id, timeout=timeout, scope=self.scope, namespace=self.namespace
        )

    def __repr__(self) -> str:
        return f"AsyncMapped(job_id={self.job_id!r})"
