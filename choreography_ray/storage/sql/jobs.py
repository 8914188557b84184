"""SQL job records of one partition: reads, compare-and-set writes, queries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import and_, delete, func, not_, select
from sqlalchemy.sql.elements import ColumnElement

from ...jobs.errors import VersionConflictError
from ...jobs.state import JobState, to_micros
from ...jobs.status import TERMINAL_JOB_STATUSES, JobStatus
from ..codec import JobLookup, check_id, check_job_key
from ..job_order import JobOrder
from ..protocols import JobQuery
from ..step_query import PREFIX_END
from .base import SqlRecords, scalar
from .schema import jobs_table

_TERMINAL = tuple(sorted(int(s) for s in TERMINAL_JOB_STATUSES))


def excluding_finalized_stops(statuses: Iterable[JobStatus]) -> ColumnElement[bool] | None:
    """Jobs in `statuses` but not Stopped with a finalized stop; None when no status is asked.

    Served by `ix_choreography_jobs_stop`, whose columns hold every column this tests.
    """
    wanted = sorted({int(s) for s in statuses})
    if not wanted:
        return None
    return and_(
        jobs_table.c.status.in_(wanted),
        not_(and_(jobs_table.c.status == int(JobStatus.STOPPED), jobs_table.c.stop_finalized)),
    )


def _ordering(query: JobQuery) -> list[ColumnElement[Any]]:
    """The query's order as columns, each descending when the query is."""
    c = jobs_table.c
    orders: dict[JobOrder, list[ColumnElement[Any]]] = {
        JobOrder.CREATED: [c.created, c.id],
        JobOrder.CHANGED: [c.changed, c.id],
        JobOrder.ID: [c.id],
        JobOrder.STATUS: [c.status, c.created, c.id],
    }
    columns = orders[query.order]
    return [column.desc() for column in columns] if query.descending else columns


_JobRow = tuple[str, tuple[Any, ...], int]
"""A job record as a write binds it: its text, its columns and the version it replaces."""


class SqlJobStorage(JobLookup, SqlRecords):
    async def find(self, job_id: str) -> JobState | None:
        check_id(job_id, "job id")
        row = await self._read(self._find, job_id)  # never queued behind a waiting write
        if row is None:
            return None
        return self._codec.decode_job(row[1], row[0], job_id)

    def _find(self, job_id: str) -> tuple[int, str] | None:
        with self.provider.autocommit() as connection:
            row = connection.exec_driver_sql(
                self._sql.find_job, (self.key.scope, self.key.namespace, job_id)
            ).first()
        return None if row is None else (row[0], row[1])

    async def save(self, state: JobState) -> int:
        check_id(state.id, "job id")
        check_job_key(state, self.key)
        return await self._quick(self._save, state, [])

    def _save(self, state: JobState, taken: list[_JobRow]) -> int:
        """Write the record as the first attempt took it (`taken`): an attempt made again after
        the SQLite lock was taken writes the same text and columns, however the state moved
        meanwhile, and does not encode it again (a record that holds its plan is large)."""
        if not taken:
            taken.append(
                (
                    self._codec.encode_job(state),
                    (
                        state.type,
                        int(state.status),
                        to_micros(state.created),
                        state.stop_finalized,
                        to_micros(state.last_change),
                    ),
                    state.version,
                )
            )
        document, columns, expected = taken[0]
        scope, namespace = self.key.scope, self.key.namespace
        with self.provider.autocommit() as connection:
            if expected == 0:
                written = connection.exec_driver_sql(
                    self._sql.insert_job, (scope, namespace, state.id, *columns, document)
                ).rowcount
            else:
                written = 0
                key = (scope, namespace, state.id, expected)
                if self.provider.is_sqlite:
                    written = connection.exec_driver_sql(
                        self._sql.update_job_record, (expected + 1, document, *key, *columns)
                    ).rowcount
                if not written:
                    written = connection.exec_driver_sql(
                        self._sql.update_job, (*columns, expected + 1, document, *key)
                    ).rowcount
            if written != 1:
                stored = connection.exec_driver_sql(
                    self._sql.job_version, (scope, namespace, state.id)
                ).scalar()
                raise VersionConflictError(
                    f"job {state.id!r}: stored version is {stored or 0}, write expected {expected}",
                    [state.id],
                )
        return expected + 1

    async def remove(self, job_id: str) -> bool:
        check_id(job_id, "job id")
        return await self._quick(self._delete, self._where(jobs_table.c.id == job_id)) > 0

    async def remove_terminal(self, job_id: str) -> bool:
        check_id(job_id, "job id")
        where = self._where(jobs_table.c.id == job_id, jobs_table.c.status.in_(_TERMINAL))
        return await self._run(self._delete, where) > 0

    def _delete(self, where: ColumnElement[bool]) -> int:
        with self.provider.autocommit() as connection:
            return connection.execute(delete(jobs_table).where(where)).rowcount

    def _where(self, *conditions: ColumnElement[bool]) -> ColumnElement[bool]:
        return and_(
            jobs_table.c.scope == self.key.scope,
            jobs_table.c.namespace == self.key.namespace,
            *conditions,
        )

    def _matching(self, query: JobQuery) -> ColumnElement[bool]:
        conditions = []
        if query.type is not None:
            conditions.append(jobs_table.c.type == query.type)
        if query.statuses:
            conditions.append(jobs_table.c.status.in_(sorted(int(s) for s in query.statuses)))
        if query.created_before is not None:
            conditions.append(jobs_table.c.created < to_micros(query.created_before))
        if query.created_after is not None:
            conditions.append(jobs_table.c.created >= to_micros(query.created_after))
        if query.changed_before is not None:
            conditions.append(jobs_table.c.changed < to_micros(query.changed_before))
        if query.changed_after is not None:
            conditions.append(jobs_table.c.changed >= to_micros(query.changed_after))
        if query.id_prefix:
            conditions.append(jobs_table.c.id >= query.id_prefix)
            conditions.append(jobs_table.c.id < query.id_prefix + PREFIX_END)
        return self._where(*conditions)

    async def query(self, query: JobQuery | None = None) -> list[JobState]:
        query = query or JobQuery()
        statement = (
            select(jobs_table.c.id, jobs_table.c.version, jobs_table.c.state)
            .where(self._matching(query))
            .order_by(*_ordering(query))
        )
        if query.skip:
            statement = statement.offset(query.skip)
        if query.take > 0:
            statement = statement.limit(query.take)
        return await self._listing(self._decoded, statement)

    async def count(self, query: JobQuery | None = None) -> int:
        statement = (
            select(func.count()).select_from(jobs_table).where(self._matching(query or JobQuery()))
        )
        return await self._listing(scalar, self.provider, statement)

    async def get_jobs_excluding_finalized_stops(
        self, statuses: Iterable[JobStatus]
    ) -> list[JobState]:
        wanted = excluding_finalized_stops(statuses)
        if wanted is None:
            return []
        statement = (
            select(jobs_table.c.id, jobs_table.c.version, jobs_table.c.state)
            .where(self._where(wanted))
            .order_by(jobs_table.c.created, jobs_table.c.id)
        )
        return await self._run(self._decoded, statement)

    def _decoded(self, statement: Any) -> list[JobState]:
        with self.provider.autocommit() as connection:
            rows = connection.execute(statement).all()
        decode = self._codec.decode_job_or_skip
        decoded = (decode(document, version, job_id) for job_id, version, document in rows)
        return [state for state in decoded if state is not None]
