"""In-process storage (`memory://`): for tests and single-process use.

Records are kept as the same JSON the other providers store, so a value that round-trips here
round-trips everywhere, and no caller can change a stored record through an object it holds.
Each URL names its own store: `memory://a` and `memory://b` share nothing, and two providers
opened on the same URL in one process share the data (as two hosts share a database).
"""

from __future__ import annotations

import heapq
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import ClassVar

from ..jobs.errors import VersionConflictError
from ..jobs.options import JobsOptions
from ..jobs.registry import TypeRegistry
from ..jobs.state import JobKey, JobState, JobStepState, PlannedStep, to_micros
from ..jobs.status import TERMINAL_JOB_STATUSES, JobStatus, JobStepStatus
from .codec import (
    JobLookup,
    StepLookup,
    StepRecord,
    check_batch,
    check_id,
    check_job_key,
)
from .memory_rows import JobRow, MemoryStore, PartitionPart, StepRow
from .protocols import (
    PLAN_PART,
    STEP_PART,
    JobQuery,
    JobsStorage,
    StepCounts,
    StepPart,
    StorageCapabilities,
    check_take,
)
from .provider import StorageProvider
from .step_query import StepPage, StepQuery, changed_micros, matches, select_page
from .url import StorageURL


def _unfinished_in(row: JobRow, statuses: set[int]) -> bool:
    """In `statuses`, and not a Stopped job whose stop is finalized."""
    return row.status in statuses and not (row.status == JobStatus.STOPPED and row.stop_finalized)


_KEPT = frozenset(int(s) for s in (JobStepStatus.FAILED, JobStepStatus.COMPLETED_WITH_FAILURE))
"""Statuses of the steps `remove_all_non_failed_for_job` keeps, when readable."""

_STORES: dict[str, MemoryStore] = {}
_STORES_LOCK = threading.Lock()


def _store_for(url: StorageURL) -> MemoryStore:
    with _STORES_LOCK:
        return _STORES.setdefault(url.without_query(), MemoryStore())


def forget_memory_store(url: str) -> None:
    """Drop the data of a `memory://` URL in this process."""
    with _STORES_LOCK:
        _STORES.pop(StorageURL(url).without_query(), None)


class MemoryStorage(StorageProvider):
    capabilities: ClassVar[StorageCapabilities] = StorageCapabilities(
        external_step_plans=True,
        atomic_batches=True,
        shared_across_processes=False,
        partition_catalog=True,
    )

    def __init__(
        self,
        url: StorageURL,
        *,
        registry: TypeRegistry | None = None,
        options: JobsOptions | None = None,
    ) -> None:
        super().__init__(url, registry=registry, options=options)
        self.store = _store_for(url)

    async def keys_with_jobs(self, statuses: Iterable[JobStatus]) -> list[JobKey]:
        wanted = {int(s) for s in statuses}
        with self.store.lock:
            keys = [
                key
                for key, partition in self.store.partitions.items()
                if any(_unfinished_in(row, wanted) for row in partition.jobs.values())
            ]
        return sorted(keys, key=lambda key: (key.scope, key.namespace))

    def _open_partition(self, key: JobKey) -> JobsStorage:
        partition = self.store.partition(key)
        lock = self.store.lock
        return JobsStorage(
            key=key,
            jobs=MemoryJobStorage(key, partition, lock, self.codec),
            steps=MemoryJobStepStorage(key, partition, lock, self.codec),
            plans=MemoryStepPlanStorage(key, partition, lock, self.codec),
        )


class MemoryJobStorage(JobLookup, PartitionPart):
    async def find(self, job_id: str) -> JobState | None:
        check_id(job_id, "job id")
        with self._lock:
            row = self._p.jobs.get(job_id)
        if row is None:
            return None
        return self._codec.decode_job(row.document, row.version, job_id)

    async def save(self, state: JobState) -> int:
        check_id(state.id, "job id")
        check_job_key(state, self.key)
        document = self._codec.encode_job(state)
        with self._lock:
            row = self._p.jobs.get(state.id)
            stored = row.version if row is not None else 0
            if stored != state.version:
                raise VersionConflictError(
                    f"job {state.id!r}: stored version is {stored}, write expected {state.version}",
                    [state.id],
                )
            version = stored + 1
            self._p.jobs[state.id] = JobRow(
                version=version,
                type=state.type,
                status=int(state.status),
                created_us=to_micros(state.created),
                stop_finalized=state.stop_finalized,
                document=document,
                changed_us=to_micros(state.last_change),
            )
        return version

    async def remove(self, job_id: str) -> bool:
        check_id(job_id, "job id")
        with self._lock:
            return self._p.jobs.pop(job_id, None) is not None

    async def remove_terminal(self, job_id: str) -> bool:
        check_id(job_id, "job id")
        with self._lock:
            row = self._p.jobs.get(job_id)
            if row is None or row.status not in TERMINAL_JOB_STATUSES:
                return False
            del self._p.jobs[job_id]
            return True

    def _matching(self, query: JobQuery) -> list[tuple[str, JobRow]]:
        statuses = {int(s) for s in query.statuses}
        bound = to_micros(query.created_before) if query.created_before else None
        start = to_micros(query.created_after) if query.created_after else None
        changed_before = to_micros(query.changed_before) if query.changed_before else None
        changed_after = to_micros(query.changed_after) if query.changed_after else None
        with self._lock:
            rows = [
                (job_id, row)
                for job_id, row in self._p.jobs.items()
                if (query.type is None or row.type == query.type)
                and (not statuses or row.status in statuses)
                and (bound is None or row.created_us < bound)
                and (start is None or row.created_us >= start)
                and (changed_before is None or row.changed_us < changed_before)
                and (changed_after is None or row.changed_us >= changed_after)
                and job_id.startswith(query.id_prefix)
            ]
        order = query.order
        rows.sort(key=lambda item: item[1].order_key(item[0], order), reverse=query.descending)
        return rows

    async def query(self, query: JobQuery | None = None) -> list[JobState]:
        query = query or JobQuery()
        rows = self._matching(query)
        rows = rows[query.skip :]
        if query.take > 0:
            rows = rows[: query.take]
        decoded = (self._codec.decode_job_or_skip(r.document, r.version, i) for i, r in rows)
        return [state for state in decoded if state is not None]

    async def count(self, query: JobQuery | None = None) -> int:
        return len(self._matching(query or JobQuery()))

    async def get_jobs_excluding_finalized_stops(
        self, statuses: Iterable[JobStatus]
    ) -> list[JobState]:
        wanted = {int(s) for s in statuses}
        with self._lock:
            rows = sorted(
                (
                    (job_id, row)
                    for job_id, row in self._p.jobs.items()
                    if _unfinished_in(row, wanted)
                ),
                key=lambda item: (item[1].created_us, item[0]),
            )
        decoded = (self._codec.decode_job_or_skip(r.document, r.version, i) for i, r in rows)
        return [state for state in decoded if state is not None]


class MemoryJobStepStorage(StepLookup, PartitionPart):
    async def find(self, job_id: str, step_id: str) -> JobStepState | None:
        check_id(job_id, "job id")
        check_id(step_id, "step id")
        with self._lock:
            row = self._p.steps.get(job_id, {}).get(step_id)
        if row is None:
            return None
        return self._codec.decode_step(row.document, row.version, step_id)

    async def get_many(self, job_id: str, step_ids: Sequence[str]) -> list[JobStepState]:
        check_id(job_id, "job id")
        with self._lock:
            steps = self._p.steps.get(job_id, {})
            rows = [(i, steps.get(check_id(i, "step id"))) for i in step_ids]
        decoded = (
            self._codec.decode_step_or_skip(row.document, row.version, i)
            for i, row in rows
            if row is not None
        )
        return [state for state in decoded if state is not None]

    async def save(self, state: JobStepState) -> int:
        return (await self.save_many([state]))[0]

    async def save_many(self, states: Sequence[JobStepState]) -> list[int]:
        if not states:
            return []
        check_batch(states)
        documents = [self._codec.encode_step(state) for state in states]
        with self._lock:
            conflicts = []
            for state in states:
                row = self._p.steps.get(state.job_id, {}).get(state.id)
                stored = row.version if row is not None else 0
                if stored != state.version:
                    conflicts.append(state.id)
            if conflicts:
                raise VersionConflictError(
                    f"{len(conflicts)} step record(s) changed since they were read "
                    f"(first: {conflicts[0]!r}); nothing of the batch was written",
                    conflicts,
                )
            versions = []
            for state, document in zip(states, documents, strict=True):
                version = state.version + 1
                self._p.steps.setdefault(state.job_id, {})[state.id] = StepRow(
                    version=version,
                    status=int(state.status),
                    stage=state.stage,
                    document=document,
                    type=state.type,
                    position=state.position,
                    changed=changed_micros(state),
                )
                versions.append(version)
        return versions

    def _rows(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None
    ) -> list[tuple[str, StepRow]]:
        check_id(job_id, "job id")
        wanted = None if statuses is None else {int(s) for s in statuses}
        with self._lock:
            rows = [
                (step_id, row)
                for step_id, row in self._p.steps.get(job_id, {}).items()
                if wanted is None or row.status in wanted
            ]
        rows.sort(key=lambda item: (item[1].stage, item[0]))
        return rows

    def _records(self, job_id: str, statuses: Iterable[JobStepStatus] | None) -> list[StepRecord]:
        return [(i, row.version, row.document) for i, row in self._rows(job_id, statuses)]

    async def get_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> list[JobStepState]:
        return self._codec.decode_steps(job_id, self._records(job_id, statuses), strict=False)

    async def get_all_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> list[JobStepState]:
        return self._codec.decode_steps(job_id, self._records(job_id, statuses), strict=True)

    async def part_for_job(
        self, job_id: str, after: str | None = None, take: int = STEP_PART
    ) -> StepPart:
        check_id(job_id, "job id")
        check_take(take)
        with self._lock:
            rows = heapq.nsmallest(
                take,
                (
                    (step_id, row.version, row.document)
                    for step_id, row in self._p.steps.get(job_id, {}).items()
                    if after is None or step_id > after
                ),
                key=lambda record: record[0],
            )
        return self._codec.step_part(rows, take)

    async def count_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> int:
        return len(self._rows(job_id, statuses))

    async def query(self, job_id: str, query: StepQuery | None = None) -> StepPage:
        check_id(job_id, "job id")
        with self._lock:
            rows = dict(self._p.steps.get(job_id, {}))
        page, following = select_page((row.key(i) for i, row in rows.items()), query or StepQuery())
        records = [
            (key.step_id, rows[key.step_id].version, rows[key.step_id].document) for key in page
        ]
        return StepPage(self._codec.decode_steps(job_id, records, strict=False), following)

    async def count(self, job_id: str, query: StepQuery | None = None) -> int:
        query = query or StepQuery()
        check_id(job_id, "job id")
        with self._lock:
            return sum(
                1 for i, row in self._p.steps.get(job_id, {}).items() if matches(row.key(i), query)
            )

    async def count_by_status(self, job_id: str, *, verify: bool = True) -> StepCounts:
        """With `verify`, reads every record; else counts the status each row keeps (a
        150,000-step job's records take seconds to read, even here)."""
        if verify:
            return self._codec.count_steps(self._records(job_id, None))
        check_id(job_id, "job id")
        with self._lock:
            statuses = Counter(row.status for row in self._p.steps.get(job_id, {}).values())
        return self._codec.count_statuses(statuses.items())

    async def remove(self, job_id: str, step_id: str) -> bool:
        check_id(job_id, "job id")
        check_id(step_id, "step id")
        with self._lock:
            return self._p.steps.get(job_id, {}).pop(step_id, None) is not None

    async def remove_all_for_job(self, job_id: str) -> int:
        check_id(job_id, "job id")
        with self._lock:
            return len(self._p.steps.pop(job_id, {}))

    async def remove_all_non_failed_for_job(self, job_id: str) -> int:
        check_id(job_id, "job id")
        with self._lock:
            steps = self._p.steps.get(job_id, {})
            kept = [
                (i, row.version, row.document) for i, row in steps.items() if row.status in _KEPT
            ]
            _, unreadable = self._codec.sort_steps(kept)
            doomed = [i for i, row in steps.items() if row.status not in _KEPT or i in unreadable]
            for step_id in doomed:
                del steps[step_id]
            return len(doomed)


class MemoryStepPlanStorage(PartitionPart):
    async def save_plan(self, job_id: str, incarnation: int, steps: Sequence[PlannedStep]) -> None:
        check_id(job_id, "job id")
        documents = [self._codec.encode_planned(planned) for planned in steps]
        with self._lock:
            self._p.plans[(job_id, incarnation)] = documents

    async def append_plan(
        self, job_id: str, incarnation: int, position: int, steps: Sequence[PlannedStep]
    ) -> None:
        check_id(job_id, "job id")
        documents = [self._codec.encode_planned(planned) for planned in steps]
        with self._lock:
            stored = self._p.plans.setdefault((job_id, incarnation), [])
            del stored[position:]
            stored.extend(documents)

    async def plan_parts(self, job_id: str, incarnation: int) -> AsyncIterator[list[PlannedStep]]:
        check_id(job_id, "job id")
        position = 0
        while True:
            with self._lock:
                documents = self._p.plans.get((job_id, incarnation), [])[
                    position : position + PLAN_PART
                ]
            if not documents:
                return
            position += len(documents)
            yield [self._codec.decode_planned(document) for document in documents]

    async def delete_plan(self, job_id: str, incarnation: int) -> int:
        check_id(job_id, "job id")
        with self._lock:
            return len(self._p.plans.pop((job_id, incarnation), ()))

    async def stored_plans(self, take: int) -> list[tuple[str, int]]:
        with self._lock:
            return sorted(self._p.plans)[:take]
