"""What the engine asks of storage, and what every provider answers.

Every write of a job or step record is compare-and-set on its `version`: a record read at
version N can only be written back while the stored version is still N, and the write makes it
N + 1. Version 0 means "never saved": such a write inserts and fails if the record exists.
A lost compare-and-set raises `VersionConflictError` and changes nothing of that record.

Everything is partitioned by `JobKey` (scope, namespace): a `JobsStorage` sees only its own
partition.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..jobs.state import JobKey, JobState, JobStepState, PlannedStep, utc
from ..jobs.status import JobStatus, JobStepStatus
from .job_order import JobOrder
from .step_query import StepPage, StepQuery, key_of, matches, select_page


class JobQuery(BaseModel):
    """A page of jobs, ordered by `order` (creation time by default), ascending unless
    `descending`; every order ends with the id.

    `statuses` empty means every status; `created_before` is exclusive, `created_after`
    inclusive, and so are `changed_before` and `changed_after`, which bound the job's last
    change (`JobState.last_change`); `id_prefix` keeps the jobs whose id starts with it
    (exactly: by case, no wildcard); `take` <= 0 means no limit.
    """

    model_config = ConfigDict(frozen=True)

    type: str | None = None
    statuses: frozenset[JobStatus] = Field(default_factory=frozenset)
    created_before: datetime | None = None
    created_after: datetime | None = None
    changed_before: datetime | None = None
    changed_after: datetime | None = None
    id_prefix: str = ""
    order: JobOrder = JobOrder.CREATED
    descending: bool = False
    skip: int = 0
    take: int = 100

    @field_validator("created_before", "created_after", "changed_before", "changed_after")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return utc(value) if value is not None else None

    @field_validator("skip")
    @classmethod
    def _skip(cls, value: int) -> int:
        if value < 0:
            raise ValueError("skip must not be negative")
        return value


@dataclass(frozen=True)
class StorageCapabilities:
    """What a provider can do beyond the contract every provider keeps."""

    external_step_plans: bool
    """Plans can be stored apart from the job record, one record per step."""
    atomic_batches: bool
    """`save_many` applies all records of a batch or none."""
    shared_across_processes: bool
    """Two processes opening the same URL see the same data."""
    partition_catalog: bool = False
    """`keys_with_jobs` names every partition of the store. Without it (the default of a
    provider of your own) it names only the partitions this process opened, and recovery
    warns that it is incomplete unless a key provider names the rest."""


class StepCounts(dict[JobStepStatus, int]):
    """A job's steps per status, of the records that can be read; `unreadable` counts the rest.

    An unreadable record (malformed, or naming a type this release does not register) has no
    status anyone can trust, so it is counted apart, never dropped: the statuses and
    `unreadable` together count every record, as `count_for_job` does.

    `verified` says how: every record read (True), or counted from the status each row keeps
    beside its record (False), which tells nothing of whether the record itself reads.
    """

    def __init__(
        self,
        counts: dict[JobStepStatus, int] | None = None,
        *,
        unreadable: int = 0,
        verified: bool = True,
    ) -> None:
        super().__init__(counts or {})
        self.unreadable = unreadable
        self.verified = verified

    @property
    def total(self) -> int:
        return sum(self.values()) + self.unreadable

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepCounts) and other.unreadable != self.unreadable:
            return False
        return super().__eq__(other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __repr__(self) -> str:
        return f"StepCounts({dict(self)!r}, unreadable={self.unreadable})"


@runtime_checkable
class JobStorage(Protocol):
    async def get(self, job_id: str) -> JobState:
        """The job; `RecordNotFoundError` when it does not exist."""
        ...

    async def find(self, job_id: str) -> JobState | None:
        """The job, or None when it does not exist."""
        ...

    async def save(self, state: JobState) -> int:
        """Compare-and-set on `state.version`; returns the new version."""
        ...

    async def remove(self, job_id: str) -> bool: ...

    async def remove_terminal(self, job_id: str) -> bool:
        """Delete the job only if its stored status is terminal; True if it was deleted."""
        ...

    async def query(self, query: JobQuery | None = None) -> list[JobState]: ...

    async def count(self, query: JobQuery | None = None) -> int:
        """How many jobs match the query's type, statuses and creation bound."""
        ...

    async def get_jobs_excluding_finalized_stops(
        self, statuses: Iterable[JobStatus]
    ) -> list[JobState]:
        """Jobs in `statuses`, leaving out Stopped jobs whose stop is finalized; ordered as
        `query` orders. What recovery reads.

        This default, inherited by a job storage that subclasses `JobStorage`, reads every job
        in `statuses` through `query` and filters the finalized stops out, at the cost of that
        read; a provider overrides it to filter in storage (a Removing job always stays).
        """
        wanted = frozenset(statuses)
        if not wanted:
            return []
        jobs = await self.query(JobQuery(statuses=wanted, take=0))
        return [job for job in jobs if not _finalized_stop(job)]


def _finalized_stop(job: JobState) -> bool:
    return job.status == JobStatus.STOPPED and job.stop_finalized


STEP_PART = 2_000
"""Step records a part read for recovery (`JobStepStorage.part_for_job`) holds at most: about
16 MB decoded, whatever the job's size."""


@dataclass(frozen=True)
class StepPart:
    """A bounded part of a job's step records, in step-id order (`part_for_job`)."""

    steps: list[JobStepState]
    """The records of the part that can be read."""
    unreadable: dict[str, str]
    """Each record of the part that cannot be read, and why."""
    last: str | None
    """The last step id of the part, read or not: the next part starts after it. None when
    the part ends the job's records."""


def check_take(take: int) -> None:
    if take < 1:
        raise ValueError(f"a part of step records takes at least one record, not {take}")


async def step_parts(steps: JobStepStorage, job_id: str) -> AsyncIterator[StepPart]:
    """Every step record of the job, a part at a time, each read as the one before is used."""
    after: str | None = None
    while True:
        part = await steps.part_for_job(job_id, after)
        yield part
        if part.last is None:
            return
        after = part.last


@runtime_checkable
class JobStepStorage(Protocol):
    async def get(self, job_id: str, step_id: str) -> JobStepState: ...

    async def find(self, job_id: str, step_id: str) -> JobStepState | None: ...

    async def get_many(self, job_id: str, step_ids: Sequence[str]) -> list[JobStepState]:
        """The asked steps that exist, in the order asked; unreadable records left out."""
        ...

    async def save(self, state: JobStepState) -> int: ...

    async def save_many(self, states: Sequence[JobStepState]) -> list[int]:
        """Compare-and-set every record in one round trip; new versions in input order.

        A record may appear once per batch. Records that lose are listed in the raised
        `VersionConflictError`; with `atomic_batches` nothing of the batch is written then.
        """
        ...

    async def get_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> list[JobStepState]:
        """The job's steps, ordered by stage and id; all statuses when `statuses` is None.

        For listings: a record that cannot be read is left out, with a warning in the log.
        """
        ...

    async def get_all_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> list[JobStepState]:
        """`get_for_job` for the engine: every record, or `UnreadableStepsError` naming each
        one that cannot be read. A job is never resumed, counted or completed from part of
        its steps."""
        ...

    async def part_for_job(
        self, job_id: str, after: str | None = None, take: int = STEP_PART
    ) -> StepPart:
        """At most `take` of the job's step records, in step-id order, those after step id
        `after` (from the first without): what recovery reads (`step_parts`), so that a job of
        millions of steps is never held whole. A record that cannot be read is named in the
        part's `unreadable`, neither left out nor raised: the reader decides whether it
        refuses (a resume does, a stop goes on)."""
        ...

    async def count_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> int: ...

    async def count_by_status(self, job_id: str, *, verify: bool = True) -> StepCounts:
        """How many of the job's step records are in each status; unreadable ones apart.

        With `verify`, every record is read: only reading tells the unreadable ones (a
        million records take tens of seconds). Without, a provider may count by the status it
        keeps beside each record, from an index (a million in 0.1 s): every record then counts
        by its stored status, readable or not (`StepCounts.verified` says which was done)."""
        ...

    async def query(self, job_id: str, query: StepQuery | None = None) -> StepPage:
        """A page of the job's steps: those the query's filter keeps, in its order, after its
        cursor; for listings, so an unreadable record is left out (with a warning in the log).

        This default, inherited by a step storage that subclasses `JobStepStorage`, reads
        every step of the job through `get_for_job` and pages in memory; a provider overrides
        it to read one page from an index."""
        query = query or StepQuery()
        states = {s.id: s for s in await self.get_for_job(job_id, query.statuses or None)}
        page, following = select_page((key_of(s) for s in states.values()), query)
        return StepPage([states[key.step_id] for key in page], following)

    async def count(self, job_id: str, query: StepQuery | None = None) -> int:
        """How many of the job's steps the query's filter keeps (its cursor and take aside).

        A provider filters by what it keeps beside each record, so a record that cannot be
        read may count; this default reads every step of the job, as `query`'s does, and
        counts the readable ones."""
        query = query or StepQuery()
        states = await self.get_for_job(job_id, query.statuses or None)
        return sum(1 for state in states if matches(key_of(state), query))

    async def remove(self, job_id: str, step_id: str) -> bool: ...

    async def remove_all_for_job(self, job_id: str) -> int:
        """Delete every record of the job's steps, readable or not."""
        ...

    async def remove_all_non_failed_for_job(self, job_id: str) -> int:
        """Delete the job's steps except the failed ones, which stay queryable; an unreadable
        record is deleted whatever its stored status, since no query can show it."""
        ...


PLAN_PART = 10_000
"""Entries a part of a plan read back (`StepPlanStorage.plan_parts`) holds at most."""


@runtime_checkable
class StepPlanStorage(Protocol):
    """Plans kept apart from the job record, fenced by incarnation."""

    async def save_plan(self, job_id: str, incarnation: int, steps: Sequence[PlannedStep]) -> None:
        """Store the plan in bounded batches, replacing an earlier attempt of this incarnation."""
        ...

    async def append_plan(
        self, job_id: str, incarnation: int, position: int, steps: Sequence[PlannedStep]
    ) -> None:
        """Add `steps` at plan `position` (how many entries were saved before them) to the plan
        that `save_plan` began: a plan too large to hold whole is saved a part at a time, in
        order, by the one activation that owns the job. A retry starts again with `save_plan`."""
        ...

    def plan_parts(self, job_id: str, incarnation: int) -> AsyncIterator[list[PlannedStep]]:
        """The plan of that incarnation a bounded part at a time, in plan order, read as it is
        consumed; none when no plan is stored."""
        ...

    async def delete_plan(self, job_id: str, incarnation: int) -> int:
        """Delete that incarnation's plan only; returns how many records went."""
        ...

    async def stored_plans(self, take: int) -> list[tuple[str, int]]:
        """The (job id, incarnation) of plans stored in this partition, by job id then
        incarnation, at most `take` of them: what cleanup checks for plans left behind."""
        ...


@dataclass(frozen=True)
class JobsStorage:
    """Everything stored for one (scope, namespace)."""

    key: JobKey
    jobs: JobStorage
    steps: JobStepStorage
    plans: StepPlanStorage | None
    """None where the provider keeps plans inline only."""
