"""What the console and the command line read: pages of jobs and steps, straight from storage.

Storage is the truth (DESIGN §3), so views read it rather than ask a controller host: a
console shows the jobs of a cluster whose hosts are down, and reading never activates a job.
A page of jobs is one `count` and one `query` with `skip`/`take` in the order asked (storage
sorts, by creation, last change, id or status, either way), whatever the number of jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from ..jobs.errors import AmbiguousJobIdError, JobNotFoundError
from ..jobs.state import JobKey, JobStageProgress, JobState, JobStepState
from ..jobs.status import (
    FAILED_STEP_STATUSES,
    RUNNING_JOB_STATUSES,
    STOP_STATUSES,
    JobStatus,
    JobStepStatus,
)
from ..storage.job_order import JobOrder
from ..storage.protocols import JobQuery, StepCounts
from ..storage.provider import StorageProvider
from ..storage.step_query import StepCursor, StepQuery
from .html import when

T = TypeVar("T")
S = TypeVar("S", JobStatus, JobStepStatus)

MAX_PAGE_SIZE = 500
"""The largest page a view asks for: a bigger one is refused, never silently cut."""


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a listing shows, in what order. `page` counts from 0; by default newest
    first (`sort` and `descending`); `id_prefix` keeps the jobs whose id starts with it;
    `created_after` (inclusive) and `created_before` (exclusive) bound their creation,
    `changed_after` and `changed_before` their last change alike."""

    key: JobKey = field(default_factory=JobKey)
    statuses: frozenset[JobStatus] = frozenset()
    type: str | None = None
    page: int = 0
    size: int = 50
    id_prefix: str = ""
    created_after: datetime | None = None
    created_before: datetime | None = None
    changed_after: datetime | None = None
    changed_before: datetime | None = None
    sort: JobOrder = JobOrder.CREATED
    descending: bool = True

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
        """A page of jobs, in the order `wanted` asks."""
        storage = self.provider.for_key(wanted.key)
        query = JobQuery(
            type=wanted.type or None,
            statuses=wanted.statuses,
            id_prefix=wanted.id_prefix,
            created_after=wanted.created_after,
            created_before=wanted.created_before,
            changed_after=wanted.changed_after,
            changed_before=wanted.changed_before,
            order=wanted.sort,
            descending=wanted.descending,
            skip=wanted.page * wanted.size,
            take=wanted.size,
        )
        total = await storage.jobs.count(query)
        found = await storage.jobs.query(query) if query.skip < total else []
        return Page(found, total, wanted.page, wanted.size)

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
        """The job whose id is `job_id`, or else the one job whose id starts with it."""
        jobs = self.provider.for_key(key).jobs
        state = await jobs.find(job_id)
        if state is not None:
            return state
        query = JobQuery(id_prefix=job_id, take=MATCHES_SHOWN + 1)
        found = {job.id: job for job in await jobs.query(query)}
        return found[chosen_id(job_id, list(found))]

    async def step_counts(self, key: JobKey, job_id: str, *, verify: bool = True) -> StepCounts:
        """The job's step records per status; `verify` reads each one (see `StepStore`)."""
        return await self.provider.for_key(key).steps.count_by_status(job_id, verify=verify)

    async def step(self, key: JobKey, job_id: str, step_id: str) -> JobStepState:
        """The step; `RecordNotFoundError` when the job has none of that id."""
        return await self.provider.for_key(key).steps.get(job_id, step_id)

    async def steps(self, key: JobKey, job_id: str, query: StepQuery) -> StepListing:
        """A page of the job's steps (storage's paged query), with how many match in all."""
        steps = self.provider.for_key(key).steps
        page = await steps.query(job_id, query)
        return StepListing(page.steps, await steps.count(job_id, query), page.next)


@dataclass(frozen=True)
class StepListing:
    """A page of a job's steps: the steps, how many match the filter in all, and the cursor
    of the next page (None on the last)."""

    steps: list[JobStepState]
    total: int
    next: StepCursor | None


MATCHES_SHOWN = 5
"""How many of the jobs an ambiguous id prefix starts are named."""


def chosen_id(given: str, found: list[str]) -> str:
    """The one id of `found` (ids of jobs listed by the prefix `given`) that `given` starts;
    not found, or ambiguous, is an error naming the matches."""
    matching = [job_id for job_id in found if job_id.startswith(given)]
    if not matching:
        raise JobNotFoundError(given)
    if len(matching) > 1:
        shown = matching[:MATCHES_SHOWN]
        raise AmbiguousJobIdError(given, shown, len(matching) > MATCHES_SHOWN)
    return matching[0]


def reads_every_step(job: JobState) -> bool:
    """Whether a view of the job counts its steps by reading every record: for a job at rest,
    where only reading tells the unreadable ones (it will not resume with them); not while it
    runs, when the counts move every second and a large job's records take seconds to read
    (counted then by the status stored beside each, from an index)."""
    return job.status not in RUNNING_JOB_STATUSES


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

PREPARED = "prepared"
"""A step's status before its first run: stored as `UNKNOWN`, shown and filtered as this."""


def step_status_name(status: JobStepStatus) -> str:
    """How a step's status is shown: `PREPARED` for a step prepared and never run."""
    return PREPARED.upper() if status == JobStepStatus.UNKNOWN else status.name


def parse_step_statuses(names: list[str]) -> frozenset[JobStepStatus]:
    """Step statuses by name; `failed` stands for both failure statuses, `prepared` (or
    `unknown`) for a step prepared and never run."""
    wanted: set[JobStepStatus] = set()
    for name in names:
        word = name.strip().lower()
        if word == FAILED_STEPS:
            wanted |= FAILED_STEP_STATUSES
        elif word == PREPARED:
            wanted.add(JobStepStatus.UNKNOWN)
        else:
            try:
                wanted.add(parse_status(name, JobStepStatus))
            except ValueError:
                choices = ", ".join(
                    [PREPARED, FAILED_STEPS]
                    + [
                        s.name.lower()
                        for s in JobStepStatus
                        if s != JobStepStatus.UNKNOWN and s.name.lower() != FAILED_STEPS
                    ]
                )
                raise ValueError(f"unknown step status {name!r}; one of: {choices}") from None
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


def change_event(before: int | None, before_host: str, status: int, host: str) -> str:
    """What a change means after the one before it (`before`, made on `before_host`, the last
    host named so far)."""
    if before is None:
        return "created"
    moved = bool(host and before_host and host != before_host)
    if status == JobStatus.RUNNING and before == JobStatus.RUNNING:
        if moved:
            return f"recovered on {host}: the owner changed from {before_host}"
        return "resumed by a new activation after an interruption"
    if status == JobStatus.RUNNING and before == JobStatus.STOPPED:
        return "resumed" + (f" on {host}" if moved else "")
    if status == JobStatus.STOPPED:
        return "stopped"
    if status == JobStatus.REMOVING:
        return "removal requested"
    if moved:
        return f"owner changed from {before_host} to {host}"
    return ""


def stage_state(stage: JobStageProgress) -> str:
    """A stage in a word: "finished" once every step of it is done, not "started" for ever."""
    if stage.is_completed and stage.total_steps:
        return "finished"
    return "started" if stage.is_started else "not started"
