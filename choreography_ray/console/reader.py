"""What the console and the command line read: pages of jobs and steps, straight from storage.

Storage is the truth (DESIGN §3), so views read it rather than ask a controller host: a
console shows the jobs of a cluster whose hosts are down, and reading never activates a job.
Pages are newest first. Every provider orders jobs oldest first, so a page is counted from the
end: one `count` and one `query` with `skip`/`take` per page, whatever the number of jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..jobs.errors import JobNotFoundError
from ..jobs.state import JobKey, JobState, JobStepState
from ..jobs.status import (
    FAILED_STEP_STATUSES,
    RUNNING_JOB_STATUSES,
    STOP_STATUSES,
    JobStatus,
    JobStepStatus,
)
from ..storage.protocols import JobQuery, StepCounts
from ..storage.provider import StorageProvider
from .html import when

T = TypeVar("T")
S = TypeVar("S", JobStatus, JobStepStatus)

MAX_PAGE_SIZE = 500
"""The largest page a view asks for: a bigger one is refused, never silently cut."""


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a listing shows. `page` counts from 0, newest first."""

    key: JobKey = field(default_factory=JobKey)
    statuses: frozenset[JobStatus] = frozenset()
    type: str | None = None
    page: int = 0
    size: int = 50

    def __post_init__(self) -> None:
        check_page(self.page, self.size)


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing, with the total it was cut from."""

    items: list[T]
    total: int
    page: int
    size: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def has_previous(self) -> bool:
        return self.page > 0

    @property
    def has_next(self) -> bool:
        return (self.page + 1) * self.size < self.total


def check_page(page: int, size: int) -> None:
    """A page number from 0 and a size from 1 to MAX_PAGE_SIZE; anything else is a mistake."""
    if page < 0:
        raise ValueError(f"page must be 0 or more (got {page})")
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise ValueError(f"page size must be between 1 and {MAX_PAGE_SIZE} (got {size})")


class JobsReader:
    """Read-only views of one storage provider (its `initialize` is the caller's)."""

    def __init__(self, provider: StorageProvider) -> None:
        self.provider = provider

    async def jobs(self, wanted: JobFilter) -> Page[JobState]:
        """A page of jobs, newest first."""
        storage = self.provider.for_key(wanted.key)
        query = JobQuery(type=wanted.type or None, statuses=wanted.statuses, take=0)
        total = await storage.jobs.count(query)
        end = total - wanted.page * wanted.size
        if end <= 0:
            return Page([], total, wanted.page, wanted.size)
        start = max(0, end - wanted.size)
        found = await storage.jobs.query(
            query.model_copy(update={"skip": start, "take": end - start})
        )
        return Page(list(reversed(found)), total, wanted.page, wanted.size)

    async def busy_partitions(self) -> list[JobKey]:
        """The partitions holding unfinished jobs (running, or stopping), as recovery's catalog
        names them: where an operator most likely wants to look."""
        return await self.provider.keys_with_jobs({*RUNNING_JOB_STATUSES, *STOP_STATUSES})

    async def status_counts(self, key: JobKey) -> dict[JobStatus, int]:
        """How many of the partition's jobs are in each status (statuses with none left out):
        one count per status (on SQL, from the (scope, namespace, status) index)."""
        jobs = self.provider.for_key(key).jobs
        counts = {}
        for status in JobStatus:
            n = await jobs.count(JobQuery(statuses=frozenset({status}), take=0))
            if n:
                counts[status] = n
        return counts

    async def job(self, key: JobKey, job_id: str) -> JobState:
        state = await self.provider.for_key(key).jobs.find(job_id)
        if state is None:
            raise JobNotFoundError(job_id)
        return state

    async def step_counts(self, key: JobKey, job_id: str, *, verify: bool = True) -> StepCounts:
        """The job's step records per status; `verify` reads each one (see `StepStore`)."""
        return await self.provider.for_key(key).steps.count_by_status(job_id, verify=verify)

    async def steps(
        self,
        key: JobKey,
        job_id: str,
        statuses: frozenset[JobStepStatus] = frozenset(),
        page: int = 0,
        size: int = 50,
    ) -> Page[JobStepState]:
        """A page of the job's steps, by stage and id. The step protocol has no paged query,
        so the job's steps in `statuses` are read and cut here (see docs/decisions.md)."""
        check_page(page, size)
        found = await self.provider.for_key(key).steps.get_for_job(job_id, statuses or None)
        return Page(found[page * size : (page + 1) * size], len(found), page, size)


def parse_status(name: str, kind: type[S]) -> S:
    """A status from its name in any case, with `-` or `_`: "running", "COMPLETED-WITH-FAILURES"."""
    try:
        return kind[name.strip().upper().replace("-", "_")]
    except KeyError:
        choices = ", ".join(s.name.lower() for s in kind)
        raise ValueError(f"unknown status {name!r}; one of: {choices}") from None


FAILED_STEPS = "failed"
"""The step filter that means every failure: FAILED and COMPLETED_WITH_FAILURE, the statuses
whose records stay queryable after the job completes."""


def parse_step_statuses(names: list[str]) -> frozenset[JobStepStatus]:
    """Step statuses by name; `failed` stands for both failure statuses."""
    wanted: set[JobStepStatus] = set()
    for name in names:
        if name.strip().lower() == FAILED_STEPS:
            wanted |= FAILED_STEP_STATUSES
        else:
            wanted.add(parse_status(name, JobStepStatus))
    return frozenset(wanted)


def waiting_for_worker(job: JobState) -> Any:
    """The job's wait for a worker host (`reason`, `since`), or None. Read by name: the field
    comes with placement's wait for workers, and records without it read as not waiting."""
    return getattr(job, "waiting_for_worker", None)


def key_wait(job: JobState) -> Any:
    """The job's wait for its concurrency key (`text()`: "waiting: key K at its limit N"),
    while it runs; else None."""
    return job.waiting_for_key if job.status == JobStatus.RUNNING else None


def status_text(job: JobState) -> str:
    """The status, with "(quarantined)" once recovery gave up on the job, or "(waiting)"
    while it waits for a worker host or for its concurrency key."""
    if job.quarantine is not None:
        return f"{job.status.name} (quarantined)"
    waiting = waiting_for_worker(job) is not None or key_wait(job) is not None
    return job.status.name + (" (waiting)" if waiting else "")


def quarantine_text(job: JobState) -> str:
    """ "quarantined since <when> UTC after <n> recovery attempts: <reason>", or ""."""
    quarantine = job.quarantine
    if quarantine is None:
        return ""
    since = when(quarantine.since)
    return f"quarantined since {since} UTC after {quarantine.attempts} recovery attempts: " + (
        quarantine.reason
    )
