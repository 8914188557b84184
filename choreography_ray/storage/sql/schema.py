"""The SQL schema as queries see it: tables, their indexes, and the hot-path statements.

The migrations in ./migrations create it; a test checks the two agree.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from itertools import chain
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)

VERSION_TABLE = "choreography_alembic_version"
HEAD_REVISION = "0004"
"""The newest migration of this release (a test keeps it equal to Alembic's head)."""
MIGRATIONS = Path(__file__).parent / "migrations"


# --------------------------------------------------------------------------------------------
# Schema, as queries see it. The migrations in ./migrations create it; a test checks the two
# agree.


def _key(length: int = 200) -> Any:
    return String(length).with_variant(String(length, collation="C"), "postgresql")


INDEXES: dict[str, dict[str, list[str]]] = {
    "choreography_jobs": {
        "ix_choreography_jobs_status": ["scope", "namespace", "status"],
        "ix_choreography_jobs_type": ["scope", "namespace", "type"],
        "ix_choreography_jobs_stop": ["scope", "namespace", "status", "stop_finalized"],
        "ix_choreography_jobs_created": ["scope", "namespace", "created"],
        "ix_choreography_jobs_changed": ["scope", "namespace", "changed", "id"],
    },
    "choreography_job_steps": {
        "ix_choreography_job_steps_job_status": ["scope", "namespace", "job_id", "status"],
        "ix_choreography_job_steps_plan_order": [
            "scope",
            "namespace",
            "job_id",
            "stage",
            "position",
            "step_id",
        ],
        "ix_choreography_job_steps_changed": ["scope", "namespace", "job_id", "changed", "step_id"],
    },
}
"""The secondary indexes the migrations create, by table."""


def _indexes(table: str) -> list[Index]:
    return [Index(name, *columns) for name, columns in INDEXES[table].items()]


metadata = MetaData()

jobs_table = Table(
    "choreography_jobs",
    metadata,
    Column("scope", _key(), nullable=False),
    Column("namespace", _key(), nullable=False),
    Column("id", _key(), nullable=False),
    Column("type", _key(256), nullable=False),
    Column("status", Integer(), nullable=False),
    Column("created", BigInteger(), nullable=False),
    Column("stop_finalized", Boolean(), nullable=False),
    Column("version", BigInteger(), nullable=False),
    Column("state", Text(), nullable=False),
    Column("changed", BigInteger(), nullable=False, server_default="0"),
    PrimaryKeyConstraint("scope", "namespace", "id", name="pk_choreography_jobs"),
    *_indexes("choreography_jobs"),
)

steps_table = Table(
    "choreography_job_steps",
    metadata,
    Column("scope", _key(), nullable=False),
    Column("namespace", _key(), nullable=False),
    Column("job_id", _key(), nullable=False),
    Column("step_id", _key(), nullable=False),
    Column("type", _key(256), nullable=False),
    Column("name", Text(), nullable=False),
    Column("stage", Integer(), nullable=False),
    Column("status", Integer(), nullable=False),
    Column("version", BigInteger(), nullable=False),
    Column("state", Text(), nullable=False),
    Column("position", Integer(), nullable=False, server_default="0"),
    Column("changed", BigInteger(), nullable=False, server_default="0"),
    PrimaryKeyConstraint(
        "scope", "namespace", "job_id", "step_id", name="pk_choreography_job_steps"
    ),
    *_indexes("choreography_job_steps"),
)

plans_table = Table(
    "choreography_step_plans",
    metadata,
    Column("scope", _key(), nullable=False),
    Column("namespace", _key(), nullable=False),
    Column("job_id", _key(), nullable=False),
    Column("incarnation", BigInteger(), nullable=False),
    Column("chunk", Integer(), nullable=False),
    Column("steps", Integer(), nullable=False),
    Column("entries", Text(), nullable=False),
    PrimaryKeyConstraint(
        "scope", "namespace", "job_id", "incarnation", "chunk", name="pk_choreography_step_plans"
    ),
)
"""Plans stored apart from their job: one row per `PLAN_CHUNK` consecutive entries."""


_STEP_COLUMNS = 11
"""The parameters of one row of `insert_step`."""


def rows_within(bind_limit: int) -> int:
    """Step records one SQLite insert statement carries at most: 512 (5,632 parameters), or the
    largest power of two `bind_limit` allows (SQLite's default is 32,766 since 3.32 and 999
    before it, and a build may set its own)."""
    rows = 512
    while rows > 1 and rows * _STEP_COLUMNS > bind_limit:
        rows //= 2
    return rows


def _bind_limit() -> int:
    with closing(sqlite3.connect(":memory:")) as connection:
        return connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)


INSERT_ROWS = rows_within(_bind_limit())
"""This SQLite library's rows per insert statement."""


class Statements:
    """The hot-path statements, in the driver's own parameter style."""

    def __init__(self, mark: str, *, rows_per_insert: int = 1) -> None:
        p = mark
        self.rows_per_insert = rows_per_insert
        self._row = f"({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, 1, {p})"
        self._inserts: dict[int, str] = {}
        jobs = "choreography_jobs"
        steps = "choreography_job_steps"
        self.insert_job = (
            f"INSERT INTO {jobs} (scope, namespace, id, type, status, created, stop_finalized, "
            f"changed, version, state) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, 1, {p}) "
            "ON CONFLICT DO NOTHING"
        )
        self.update_job = (
            f"UPDATE {jobs} SET type = {p}, status = {p}, created = {p}, stop_finalized = {p}, "
            f"changed = {p}, version = {p}, state = {p} "
            f"WHERE scope = {p} AND namespace = {p} AND id = {p} AND version = {p}"
        )
        # SQLite rewrites the index entries of every column a statement sets, changed or not;
        # most writes change only the record, so try setting just that first.
        self.update_job_record = (
            f"UPDATE {jobs} SET version = {p}, state = {p} "
            f"WHERE scope = {p} AND namespace = {p} AND id = {p} AND version = {p} "
            f"AND type = {p} AND status = {p} AND created = {p} AND stop_finalized = {p} "
            f"AND changed = {p}"
        )
        self.job_version = (
            f"SELECT version FROM {jobs} WHERE scope = {p} AND namespace = {p} AND id = {p}"
        )
        self.find_job = (
            f"SELECT version, state FROM {jobs} WHERE scope = {p} AND namespace = {p} AND id = {p}"
        )
        self.insert_step = (
            f"INSERT INTO {steps} (scope, namespace, job_id, step_id, type, name, stage, status, "
            f"position, changed, version, state) "
            f"VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, 1, {p}) "
            "ON CONFLICT DO NOTHING"
        )
        self.update_step = (
            f"UPDATE {steps} SET type = {p}, name = {p}, stage = {p}, status = {p}, "
            f"position = {p}, changed = {p}, version = {p}, state = {p} "
            f"WHERE scope = {p} AND namespace = {p} AND job_id = {p} AND step_id = {p} "
            f"AND version = {p}"
        )
        # SQLite rewrites the index entries of every column a statement sets, changed or not:
        # the indexed columns are matched, not set (a status change sets them all).
        self.update_step_record = (
            f"UPDATE {steps} SET name = {p}, version = {p}, state = {p} "
            f"WHERE scope = {p} AND namespace = {p} AND job_id = {p} AND step_id = {p} "
            f"AND version = {p} AND status = {p} AND type = {p} AND stage = {p} "
            f"AND position = {p} AND changed = {p}"
        )
        self.find_step = (
            f"SELECT version, state FROM {steps} "
            f"WHERE scope = {p} AND namespace = {p} AND job_id = {p} AND step_id = {p}"
        )

    def step_inserts(
        self, rows: list[tuple[Any, ...]]
    ) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
        """`insert_step` for many rows: statements, each with its rows of parameters (one row
        of many records' values, or on PostgreSQL every record's row for an executemany).

        On SQLite an executemany binds, steps and resets once per row; one statement of 512
        rows does the same inserts for half the CPU (2.4 against 5.0 µs a row in 1,000-row
        batches), and preparing a million steps inserts a million rows on one core. Sizes are
        powers of two, so few statement texts exist and the driver's cache keeps them.
        PostgreSQL keeps the executemany, which psycopg pipelines: statements of many rows
        took it twice as long.
        """
        if self.rows_per_insert == 1:
            if rows:
                yield self.insert_step, rows
            return
        done = 0
        while done < len(rows):
            size = self.rows_per_insert
            while size > len(rows) - done:
                size //= 2
            text = self._inserts.get(size)
            if text is None:
                text = self._inserts[size] = self.insert_step.replace(
                    self._row, ", ".join([self._row] * size)
                )
            yield text, [tuple(chain.from_iterable(rows[done : done + size]))]
            done += size
