"""SQL step plans of one partition: a plan kept apart from its job, fenced by incarnation.

A row holds `PLAN_CHUNK` consecutive entries as one JSON array rather than one entry per row:
a million-step plan is a thousand rows, written about as fast as the one inline record it
replaces, without a record of a hundred megabytes that every save of the job would rewrite and
every read of it would carry (docs/decisions.md). A row's `chunk` is the plan position of its
first entry (earlier releases numbered rows 0, 1, 2...; both read back in order), so a part
appended later needs no count of the rows before it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from sqlalchemy import delete, func, insert, select

from ...jobs.state import PlannedStep
from ..codec import check_id
from ..protocols import PLAN_PART
from .base import SqlRecords
from .schema import plans_table

PLAN_CHUNK = 1000
"""Plan entries per row."""

_INSERT_ROWS = 50
"""Rows encoded and inserted at a time: a plan is never held encoded whole."""

_READ_ROWS = PLAN_PART // PLAN_CHUNK
"""Rows read at a time by `plan_parts`."""


class SqlStepPlanStorage(SqlRecords):
    async def save_plan(self, job_id: str, incarnation: int, steps: Sequence[PlannedStep]) -> None:
        """Replace this incarnation's plan, in one transaction: an earlier (possibly partial)
        attempt is deleted first, so a retry leaves exactly one copy."""
        check_id(job_id, "job id")
        await self._run(self._save, job_id, incarnation, 0, steps, True)

    async def append_plan(
        self, job_id: str, incarnation: int, position: int, steps: Sequence[PlannedStep]
    ) -> None:
        """In one transaction, after deleting what an earlier attempt of this part left."""
        check_id(job_id, "job id")
        await self._run(self._save, job_id, incarnation, position, steps, False)

    def _save(
        self,
        job_id: str,
        incarnation: int,
        position: int,
        steps: Sequence[PlannedStep],
        replace: bool,
    ) -> None:
        scope, namespace = self.key.scope, self.key.namespace
        encode = self._codec.encode_plan_chunk
        statement = insert(plans_table)
        with self.provider.transaction(defer_checkpoint=True) as connection:
            # Replace: an earlier attempt of the whole plan; append: one of this part only.
            earlier = self._this(delete(plans_table), job_id, incarnation)
            if not replace:
                earlier = earlier.where(plans_table.c.chunk >= position)
            connection.execute(earlier)
            rows: list[dict[str, Any]] = []
            for start in range(0, len(steps), PLAN_CHUNK):
                entries = steps[start : start + PLAN_CHUNK]
                rows.append(
                    {
                        "scope": scope,
                        "namespace": namespace,
                        "job_id": job_id,
                        "incarnation": incarnation,
                        "chunk": position + start,
                        "steps": len(entries),
                        "entries": encode(entries),
                    }
                )
                if len(rows) >= _INSERT_ROWS:
                    connection.execute(statement, rows)
                    rows = []
            if rows:
                connection.execute(statement, rows)

    async def plan_parts(self, job_id: str, incarnation: int) -> AsyncIterator[list[PlannedStep]]:
        check_id(job_id, "job id")
        after = -1
        while True:
            rows = await self._run(self._load, job_id, incarnation, after)
            if not rows:
                return
            after = rows[-1][0]
            part: list[PlannedStep] = []
            for _, entries in rows:
                part.extend(self._codec.decode_plan_chunk(entries))
            yield part

    def _load(self, job_id: str, incarnation: int, after: int) -> list[tuple[int, str]]:
        c = plans_table.c
        statement = (
            self._this(select(c.chunk, c.entries), job_id, incarnation)
            .where(c.chunk > after)
            .order_by(c.chunk)
            .limit(_READ_ROWS)
        )
        with self.provider.autocommit() as connection:
            return [(int(row[0]), row[1]) for row in connection.execute(statement)]

    async def delete_plan(self, job_id: str, incarnation: int) -> int:
        check_id(job_id, "job id")
        return await self._run(self._delete, job_id, incarnation)

    def _delete(self, job_id: str, incarnation: int) -> int:
        with self.provider.transaction() as connection:
            total = select(func.coalesce(func.sum(plans_table.c.steps), 0))
            count = connection.execute(self._this(total, job_id, incarnation)).scalar()
            connection.execute(self._this(delete(plans_table), job_id, incarnation))
        return int(count or 0)

    async def stored_plans(self, take: int) -> list[tuple[str, int]]:
        return await self._run(self._stored, take)

    def _stored(self, take: int) -> list[tuple[str, int]]:
        c = plans_table.c
        statement = (
            select(c.job_id, c.incarnation)
            .where(c.scope == self.key.scope, c.namespace == self.key.namespace, c.chunk == 0)
            .order_by(c.job_id, c.incarnation)
            .limit(max(0, take))
        )
        with self.provider.autocommit() as connection:
            return [(row[0], int(row[1])) for row in connection.execute(statement)]

    def _this(self, statement: Any, job_id: str, incarnation: int) -> Any:
        c = plans_table.c
        return statement.where(
            c.scope == self.key.scope,
            c.namespace == self.key.namespace,
            c.job_id == job_id,
            c.incarnation == incarnation,
        )
