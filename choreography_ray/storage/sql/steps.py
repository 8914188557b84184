"""SQL step records of one partition: reads, batched compare-and-set writes, removal."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import Connection, Select, and_, bindparam, delete, func, literal, select, tuple_
from sqlalchemy.sql.elements import ColumnElement

from ...jobs.errors import VersionConflictError
from ...jobs.state import JobStepState
from ...jobs.status import JobStepStatus
from ..codec import StepLookup, StepRecord, check_batch, check_id
from ..protocols import STEP_PART, StepCounts, StepPart, check_take
from ..step_query import (
    PREFIX_END,
    StepKey,
    StepOrder,
    StepPage,
    StepQuery,
    paged,
)
from .base import ANALYZE_AFTER, SqlRecords, scalar
from .schema import steps_table
from .step_rows import Rows, record_only, step_rows

QUICK_BATCH = 2000
"""Batches up to this size may run inline on the event loop (SQLite), blocking it for tens of
milliseconds at most. On the provider's thread, a batch competes for the GIL with a busy
event loop row by row (sqlite3 releases the GIL around each row): measured under a host
running steps, a 1,000-row flush took over a second that way, and outcomes waited for it."""

# Conflicting step ids are looked up in chunks of this many, well below any bind limit.
_LOOKUP_CHUNK = 500
# A SQLite batch of this many records leaves the checkpoint of the log for after its answer.
_DEFERRED_CHECKPOINT_ROWS = 1000
# A batch that lost and then finds no conflict (the record moved back meanwhile) is tried again.
_BATCH_ATTEMPTS = 3

_KEPT_STEPS = (int(JobStepStatus.COMPLETED_WITH_FAILURE), int(JobStepStatus.FAILED))


class SqlJobStepStorage(StepLookup, SqlRecords):
    async def find(self, job_id: str, step_id: str) -> JobStepState | None:
        check_id(job_id, "job id")
        check_id(step_id, "step id")
        row = await self._quick(self._find, job_id, step_id)
        if row is None:
            return None
        return self._codec.decode_step(row[1], row[0], step_id)

    def _find(self, job_id: str, step_id: str) -> tuple[int, str] | None:
        with self.provider.autocommit() as connection:
            row = connection.exec_driver_sql(
                self._sql.find_step, (self.key.scope, self.key.namespace, job_id, step_id)
            ).first()
        return None if row is None else (row[0], row[1])

    async def save(self, state: JobStepState) -> int:
        return (await self.save_many([state]))[0]

    async def save_many(self, states: Sequence[JobStepState]) -> list[int]:
        if not states:
            return []
        check_batch(states)
        run = self._quick if len(states) <= QUICK_BATCH else self._run
        return await run(self._save_many, list(states), [])

    def _save_many(self, states: list[JobStepState], encoded: list[Rows]) -> list[int]:
        """Write the batch; `encoded` keeps its rows from the first attempt, so that an attempt
        made again (the SQLite lock was taken, a transient error) does not encode it again:
        encoding is most of a batch's cost. The first attempt runs where writes run (the
        event loop or the provider's thread), so encoding does too."""
        if not encoded:
            encoded.append(
                step_rows(self.key.scope, self.key.namespace, self._codec.encode_step, states)
            )
        inserts, updates = encoded[0]
        for _ in range(_BATCH_ATTEMPTS):
            if self._write_batch(inserts, updates):
                if len(inserts) >= ANALYZE_AFTER:
                    self.provider.analyze_new_steps()
                return [state.version + 1 for state in states]
            # Nothing was written. Say which records lost; if none does any more (a record
            # went back to the version read, say by removal), the batch may go through now.
            conflicts = self._conflicts(states)
            if conflicts:
                break
        else:
            conflicts = [state.id for state in states]
        raise VersionConflictError(
            f"{len(conflicts)} step record(s) changed since they were read "
            f"(first: {conflicts[0]!r}); nothing of the batch was written",
            conflicts,
        )

    def _write_batch(self, inserts: list[tuple[Any, ...]], updates: list[tuple[Any, ...]]) -> bool:
        """Apply the batch in one transaction; False (and nothing written) if any record lost.

        A batch of one record is one statement, which needs no transaction of its own.
        """
        count = len(inserts) + len(updates)
        single = count == 1
        unit = (
            self.provider.autocommit()
            if single
            else self.provider.transaction(defer_checkpoint=count >= _DEFERRED_CHECKPOINT_ROWS)
        )
        try:
            with unit as connection:
                inserted = sum(
                    _execute(connection, text, rows)
                    for text, rows in self._sql.step_inserts(inserts)
                )
                if inserted != len(inserts):
                    raise _Lost
                if updates:
                    if single and self.provider.is_sqlite:
                        written = self._update_one(connection, updates[0])
                    else:
                        written = _execute(connection, self._sql.update_step, updates)
                    if written != len(updates):
                        raise _Lost
        except _Lost:  # the transaction rolled back
            return False
        return True

    def _update_one(self, connection: Connection, full: tuple[Any, ...]) -> int:
        """One SQLite update: first setting only the record, in case the indexed columns stay."""
        if _execute(connection, self._sql.update_step_record, [record_only(full)]):
            return 1
        return _execute(connection, self._sql.update_step, [full])

    def _conflicts(self, states: list[JobStepState]) -> list[str]:
        stored = self._stored_versions([(state.job_id, state.id) for state in states])
        return [
            state.id for state in states if stored.get((state.job_id, state.id), 0) != state.version
        ]

    def _stored_versions(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        by_job: dict[str, list[str]] = {}
        for job_id, step_id in pairs:
            by_job.setdefault(job_id, []).append(step_id)
        c = steps_table.c
        found: dict[tuple[str, str], int] = {}
        with self.provider.autocommit() as connection:
            for job_id, step_ids in by_job.items():
                for step_id, version in self._select(connection, job_id, step_ids, c.version):
                    found[(job_id, step_id)] = version
        return found

    def _select(
        self, connection: Connection, job_id: str, step_ids: list[str], *columns: Any
    ) -> Iterator[Any]:
        """(step_id, *columns) of those of the job's steps that exist, in chunks of ids."""
        c = steps_table.c
        statement = select(c.step_id, *columns).where(
            c.scope == self.key.scope,
            c.namespace == self.key.namespace,
            c.job_id == job_id,
            c.step_id.in_(bindparam("step_ids", expanding=True)),
        )
        for start in range(0, len(step_ids), _LOOKUP_CHUNK):
            chunk = step_ids[start : start + _LOOKUP_CHUNK]
            yield from connection.execute(statement, {"step_ids": chunk})

    async def get_many(self, job_id: str, step_ids: Sequence[str]) -> list[JobStepState]:
        """The asked steps that exist, in the order asked; unreadable records left out."""
        check_id(job_id, "job id")
        wanted = [check_id(step_id, "step id") for step_id in step_ids]
        if not wanted:
            return []
        return await self._read(self._get_many, job_id, wanted)

    def _get_many(self, job_id: str, step_ids: list[str]) -> list[JobStepState]:
        c = steps_table.c
        unique = list(dict.fromkeys(step_ids))
        with self.provider.autocommit() as connection:
            rows = {
                step_id: (version, document)
                for step_id, version, document in self._select(
                    connection, job_id, unique, c.version, c.state
                )
            }
        decode = self._codec.decode_step_or_skip
        found = []
        for step_id in step_ids:
            row = rows.get(step_id)
            if row is not None:
                state = decode(row[1], row[0], step_id)
                if state is not None:
                    found.append(state)
        return found

    def _where(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> ColumnElement[bool]:
        c = steps_table.c
        conditions = [c.scope == self.key.scope, c.namespace == self.key.namespace]
        conditions.append(c.job_id == job_id)
        if statuses is not None:
            conditions.append(c.status.in_(sorted({int(s) for s in statuses})))
        return and_(*conditions)

    async def get_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> list[JobStepState]:
        return await self._listing(self._decoded, job_id, statuses, False)

    async def get_all_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> list[JobStepState]:
        return await self._run(self._decoded, job_id, statuses, True)

    def _decoded(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None, strict: bool
    ) -> list[JobStepState]:
        return self._codec.decode_steps(job_id, self._records(job_id, statuses), strict=strict)

    def _records(
        self,
        job_id: str,
        statuses: Iterable[JobStepStatus] | None,
        connection: Connection | None = None,
    ) -> list[StepRecord]:
        """(step id, version, record) of the job's steps, ordered by stage and id."""
        check_id(job_id, "job id")
        c = steps_table.c
        statement = (
            select(c.step_id, c.version, c.state)
            .where(self._where(job_id, statuses))
            .order_by(c.stage, c.step_id)
        )
        if connection is not None:
            return [(i, version, record) for i, version, record in connection.execute(statement)]
        with self.provider.autocommit() as own:
            return [(i, version, record) for i, version, record in own.execute(statement)]

    async def part_for_job(
        self, job_id: str, after: str | None = None, take: int = STEP_PART
    ) -> StepPart:
        """One range of the primary key: a part costs its own rows, wherever it starts."""
        check_id(job_id, "job id")
        check_take(take)
        c = steps_table.c
        where = (
            self._where(job_id) if after is None else and_(self._where(job_id), c.step_id > after)
        )
        statement = select(c.step_id, c.version, c.state).where(where).order_by(c.step_id)
        return await self._run(self._part, statement.limit(take), take)

    def _part(self, statement: Select[Any], take: int) -> StepPart:
        with self.provider.autocommit() as connection:
            rows = connection.execute(statement)
            return self._codec.step_part([(i, v, record) for i, v, record in rows], take)

    async def count_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> int:
        check_id(job_id, "job id")
        statement = (
            select(func.count()).select_from(steps_table).where(self._where(job_id, statuses))
        )
        return await self._listing(scalar, self.provider, statement)

    def _filtered(self, job_id: str, query: StepQuery) -> ColumnElement[bool]:
        """The job's steps the query's filter keeps, after its cursor."""
        c = steps_table.c
        conditions = [self._where(job_id, query.statuses or None)]
        if query.stage is not None:
            conditions.append(c.stage == query.stage)
        if query.type is not None:
            conditions.append(c.type == query.type)
        if query.id_prefix:
            # A range, which the primary key answers; ids are compared byte-wise everywhere.
            conditions.append(c.step_id >= query.id_prefix)
            conditions.append(c.step_id < query.id_prefix + PREFIX_END)
        after = query.after
        if after is not None:
            if after.order is StepOrder.PLAN:
                conditions.append(
                    tuple_(c.stage, c.position, c.step_id)
                    > tuple_(literal(after.stage), literal(after.position), literal(after.step_id))
                )
            else:
                conditions.append(
                    tuple_(c.changed, c.step_id)
                    < tuple_(literal(after.changed), literal(after.step_id))
                )
        return and_(*conditions)

    async def query(self, job_id: str, query: StepQuery | None = None) -> StepPage:
        check_id(job_id, "job id")
        return await self._listing(self._page, job_id, query or StepQuery())

    def _page(self, job_id: str, query: StepQuery) -> StepPage:
        c = steps_table.c
        order = (
            (c.stage, c.position, c.step_id)
            if query.order is StepOrder.PLAN
            else (c.changed.desc(), c.step_id.desc())
        )
        statement = (
            select(c.step_id, c.stage, c.position, c.changed, c.status, c.type, c.version, c.state)
            .where(self._filtered(job_id, query))
            .order_by(*order)
        )
        if query.limit is not None:
            statement = statement.limit(query.limit + 1)
        with self.provider.autocommit() as connection:
            rows = [
                (StepKey(i, stage, position, changed, status, type_), version, record)
                for i, stage, position, changed, status, type_, version, record in (
                    connection.execute(statement)
                )
            ]
        page, following = paged(rows, query, lambda row: row[0])
        records = [(key.step_id, version, record) for key, version, record in page]
        return StepPage(self._codec.decode_steps(job_id, records, strict=False), following)

    async def count(self, job_id: str, query: StepQuery | None = None) -> int:
        check_id(job_id, "job id")
        unpaged = (query or StepQuery()).model_copy(update={"after": None})
        statement = (
            select(func.count()).select_from(steps_table).where(self._filtered(job_id, unpaged))
        )
        return await self._listing(scalar, self.provider, statement)

    async def count_by_status(self, job_id: str, *, verify: bool = True) -> StepCounts:
        """With `verify`, reads every record: only reading tells a readable one from one that
        is not; else one `GROUP BY` over the status column, from the (job, status) index
        alone (adding the type column, to tell unknown types, read the table: 2.7 s for a
        million rows of a running job, against 0.09 s)."""
        check_id(job_id, "job id")
        if not verify:
            return await self._listing(self._count_statuses, job_id)
        return await self._listing(self._count_by_status, job_id)

    def _count_statuses(self, job_id: str) -> StepCounts:
        c = steps_table.c
        statement = (
            select(c.status, func.count()).where(self._where(job_id, None)).group_by(c.status)
        )
        with self.provider.autocommit() as connection:
            return self._codec.count_statuses(
                (int(s), int(n)) for s, n in connection.execute(statement)
            )

    def _count_by_status(self, job_id: str) -> StepCounts:
        """Rows are counted as the cursor hands them over, never all held at once (SQLite's
        cursor reads as it goes; PostgreSQL's needs a server-side cursor, in a transaction)."""
        c = steps_table.c
        statement = select(c.step_id, c.version, c.state).where(self._where(job_id, None))
        count = self._codec.count_steps
        if self.provider.is_sqlite:
            with self.provider.autocommit() as connection:
                return count((i, v, record) for i, v, record in connection.execute(statement))
        with self.provider.transaction() as connection:
            rows = connection.execution_options(yield_per=2000).execute(statement)
            return count((i, v, record) for i, v, record in rows)

    async def remove(self, job_id: str, step_id: str) -> bool:
        check_id(job_id, "job id")
        check_id(step_id, "step id")
        where = and_(self._where(job_id), steps_table.c.step_id == step_id)
        return await self._run(self._delete, where) > 0

    async def remove_all_for_job(self, job_id: str) -> int:
        check_id(job_id, "job id")
        return await self._run(self._delete, self._where(job_id))

    async def remove_all_non_failed_for_job(self, job_id: str) -> int:
        check_id(job_id, "job id")
        return await self._run(self._remove_non_failed, job_id)

    def _remove_non_failed(self, job_id: str) -> int:
        """One transaction: the steps not failed, then the failed ones that cannot be read."""
        c = steps_table.c
        with self.provider.transaction() as connection:
            removed = connection.execute(
                delete(steps_table).where(self._where(job_id), c.status.not_in(_KEPT_STEPS))
            ).rowcount
            _, unreadable = self._codec.sort_steps(self._records(job_id, None, connection))
            doomed = list(unreadable)
            statement = delete(steps_table).where(
                self._where(job_id), c.step_id.in_(bindparam("step_ids", expanding=True))
            )
            for start in range(0, len(doomed), _LOOKUP_CHUNK):
                chunk = doomed[start : start + _LOOKUP_CHUNK]
                removed += connection.execute(statement, {"step_ids": chunk}).rowcount
        return removed

    def _delete(self, where: ColumnElement[bool]) -> int:
        with self.provider.autocommit() as connection:
            return connection.execute(delete(steps_table).where(where)).rowcount


class _Lost(Exception):
    """A compare-and-set of a batch lost: roll the transaction back."""


def _execute(connection: Connection, statement: str, rows: list[tuple[Any, ...]]) -> int:
    """Run `statement` once per row (one row: a single execute); how many rows it changed."""
    if len(rows) == 1:
        return connection.exec_driver_sql(statement, rows[0]).rowcount
    return connection.exec_driver_sql(statement, rows).rowcount
