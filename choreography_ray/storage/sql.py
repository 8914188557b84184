"""SQL storage (`sqlite:///path/jobs.db`, `postgresql+psycopg://user@host/db`).

One row per job and one per step, partitioned by (scope, namespace); the record itself is the
codec's JSON in `state`, next to the columns queries filter and order on. Writes are
compare-and-set on `version` in the statement itself (`WHERE version = :read`), so no lock is
held between a read and a write. A step batch is one transaction and one executemany per kind
of write, applied whole or not at all.

The schema is created and upgraded by Alembic in `initialize()`, under a lock, so that any
number of processes may initialize the same database at once.

Calls run on worker threads, never on the event loop: one thread for SQLite (the database has
one writer; a second thread would only wait for the lock), four and a pool of four connections
for PostgreSQL. A statement that is a whole unit of work runs without BEGIN/COMMIT; a batch is
one transaction (BEGIN IMMEDIATE on SQLite, so it waits for the write lock up front, within the
busy timeout). Each unit is retried as a whole on a transient error.

URL options (query parameters, removed before the URL reaches the driver):

* SQLite: `synchronous` (OFF, NORMAL, FULL or EXTRA; default NORMAL) and `busy_timeout`
  (milliseconds; default 30000). The database runs in WAL mode; its directory is created.
* PostgreSQL: `schema`, the schema the tables live in; created if missing. Always driven by
  psycopg 3, whatever driver the scheme names.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import psycopg
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Engine,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    and_,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    not_,
    select,
    text,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.sql.elements import ColumnElement

from ..jobs.errors import ConfigurationError, VersionConflictError
from ..jobs.options import JobsOptions
from ..jobs.registry import TypeRegistry
from ..jobs.state import JobKey, JobState, JobStepState
from ..jobs.status import TERMINAL_JOB_STATUSES, JobStatus, JobStepStatus
from .codec import (
    RecordCodec,
    check_batch,
    check_id,
    check_job_key,
    not_found_job,
    not_found_step,
    to_micros,
)
from .protocols import JobQuery, JobsStorage, StorageCapabilities
from .provider import ThreadedProvider
from .url import StorageURL

_QUICK_BATCH = 2000
"""Batches up to this size may run inline on the event loop (SQLite), blocking it for tens of
milliseconds at most. On the provider's thread, a batch competes for the GIL with a busy
event loop row by row (sqlite3 releases the GIL around each row): measured under a host
running steps, a 1,000-row flush took over a second that way, and outcomes waited for it."""

_INLINE_RETRIES = (0.001, 0.002, 0.004, 0.008)
"""Pauses between inline attempts that found the SQLite write lock taken; then the thread."""

_INLINE: ContextVar[bool] = ContextVar("choreography_sqlite_inline", default=False)
"""Set while a call runs inline on the event loop: connections come from the inline engine."""

log = logging.getLogger("choreography_ray.storage")

T = TypeVar("T")

VERSION_TABLE = "choreography_alembic_version"
MIGRATIONS = Path(__file__).parent / "migrations"

DEFAULT_BUSY_TIMEOUT_MS = 30_000
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

# Conflicting step ids are looked up in chunks of this many, well below any bind limit.
_LOOKUP_CHUNK = 500
# A SQLite batch of this many records leaves the checkpoint of the log for after its answer.
_DEFERRED_CHECKPOINT_ROWS = 1000
_AUTOCHECKPOINT_PAGES = 1000  # SQLite's default
# A PostgreSQL steps table without statistics is analyzed after a batch inserts this many.
_ANALYZE_AFTER = 1000
# A batch that lost and then finds no conflict (the record moved back meanwhile) is tried again.
_BATCH_ATTEMPTS = 3

_TERMINAL = tuple(sorted(int(s) for s in TERMINAL_JOB_STATUSES))
_KEPT_STEPS = (int(JobStepStatus.COMPLETED_WITH_FAILURE), int(JobStepStatus.FAILED))


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
    },
    "choreography_job_steps": {
        "ix_choreography_job_steps_job_status": ["scope", "namespace", "job_id", "status"],
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
    PrimaryKeyConstraint(
        "scope", "namespace", "job_id", "step_id", name="pk_choreography_job_steps"
    ),
    *_indexes("choreography_job_steps"),
)


class _Statements:
    """The hot-path statements, in the driver's own parameter style."""

    def __init__(self, mark: str) -> None:
        p = mark
        jobs = "choreography_jobs"
        steps = "choreography_job_steps"
        self.insert_job = (
            f"INSERT INTO {jobs} (scope, namespace, id, type, status, created, stop_finalized, "
            f"version, state) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, 1, {p}) "
            "ON CONFLICT DO NOTHING"
        )
        self.update_job = (
            f"UPDATE {jobs} SET type = {p}, status = {p}, created = {p}, stop_finalized = {p}, "
            f"version = {p}, state = {p} "
            f"WHERE scope = {p} AND namespace = {p} AND id = {p} AND version = {p}"
        )
        # SQLite rewrites the index entries of every column a statement sets, changed or not;
        # most writes change only the record, so try setting just that first.
        self.update_job_record = (
            f"UPDATE {jobs} SET version = {p}, state = {p} "
            f"WHERE scope = {p} AND namespace = {p} AND id = {p} AND version = {p} "
            f"AND type = {p} AND status = {p} AND created = {p} AND stop_finalized = {p}"
        )
        self.job_version = (
            f"SELECT version FROM {jobs} WHERE scope = {p} AND namespace = {p} AND id = {p}"
        )
        self.find_job = (
            f"SELECT version, state FROM {jobs} WHERE scope = {p} AND namespace = {p} AND id = {p}"
        )
        self.insert_step = (
            f"INSERT INTO {steps} (scope, namespace, job_id, step_id, type, name, stage, status, "
            f"version, state) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, 1, {p}) "
            "ON CONFLICT DO NOTHING"
        )
        self.update_step = (
            f"UPDATE {steps} SET type = {p}, name = {p}, stage = {p}, status = {p}, "
            f"version = {p}, state = {p} WHERE scope = {p} AND namespace = {p} "
            f"AND job_id = {p} AND step_id = {p} AND version = {p}"
        )
        self.update_step_record = (
            f"UPDATE {steps} SET name = {p}, stage = {p}, version = {p}, state = {p} "
            f"WHERE scope = {p} AND namespace = {p} AND job_id = {p} AND step_id = {p} "
            f"AND version = {p} AND status = {p} AND type = {p}"
        )
        self.find_step = (
            f"SELECT version, state FROM {steps} "
            f"WHERE scope = {p} AND namespace = {p} AND job_id = {p} AND step_id = {p}"
        )


# --------------------------------------------------------------------------------------------
# Transient errors

_PG_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57"})
"""Connection exceptions, transaction rollbacks (serialization, deadlock), insufficient
resources (too many connections), operator intervention (shutdown, statement timeout)."""
_PG_TRANSIENT_STATES = frozenset({"55P03"})  # lock_not_available (lock_timeout)


def is_transient_error(error: BaseException) -> bool:
    """Whether a SQL storage call that failed with `error` is worth running again."""
    if isinstance(error, sa_exc.IntegrityError | sa_exc.ProgrammingError | sa_exc.DataError):
        return False
    if isinstance(error, sa_exc.DBAPIError):
        if error.connection_invalidated:
            return True
        return _driver_transient(error.orig)
    if isinstance(error, sa_exc.TimeoutError):  # no pooled connection came free in time
        return True
    return _driver_transient(error)


def _driver_transient(error: BaseException | None) -> bool:
    if error is None:
        return False
    if isinstance(error, psycopg.Error):
        if not isinstance(error, psycopg.OperationalError):
            return False
        state = error.sqlstate
        if state is None:  # raised by the client: no connection, connection lost, timeout
            return True
        return state[:2] in _PG_TRANSIENT_CLASSES or state in _PG_TRANSIENT_STATES
    if isinstance(error, sqlite3.Error):
        if not isinstance(error, sqlite3.OperationalError):
            return False
        message = str(error).lower()
        return "locked" in message or "busy" in message
    return isinstance(error, TimeoutError | ConnectionError)


# --------------------------------------------------------------------------------------------
# The provider


class SqlStorage(ThreadedProvider):
    """Jobs and steps in SQLite or PostgreSQL, through SQLAlchemy Core."""

    capabilities: ClassVar[StorageCapabilities] = StorageCapabilities(
        external_step_plans=False, atomic_batches=True, shared_across_processes=True
    )

    def __init__(
        self,
        url: StorageURL,
        *,
        registry: TypeRegistry | None = None,
        options: JobsOptions | None = None,
        threads: int | None = None,
        pool_size: int | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        dialect = url.dialect
        if dialect not in ("sqlite", "postgresql"):
            raise ConfigurationError(f"storage URL {url.redacted!r}: not a SQL URL")
        self.is_sqlite = dialect == "sqlite"
        if threads is None:
            # One writer per process for SQLite: the database has one write lock anyway.
            threads = 1 if self.is_sqlite else 4
        super().__init__(
            url,
            registry=registry,
            options=options,
            threads=threads,
            sleep=sleep,
            after_call=self._checkpoint_if_due if self.is_sqlite else None,
        )
        self.schema: str | None = None
        self._initialized = False
        self._steps_have_statistics = self.is_sqlite
        self._checkpoint_due = False
        self._housekeeping: set[asyncio.Task[None]] = set()
        try:
            if self.is_sqlite:
                self.engine = self._sqlite_engine(url)
            else:
                self.engine = self._postgres_engine(url, pool_size or threads)
        except BaseException:
            self._calls.shutdown()
            raise
        self.sql = _Statements("?" if self.is_sqlite else "%s")
        # SQLite connections run in the driver's autocommit mode already (see `_configure`).
        self._autocommit_engine = (
            self.engine
            if self.is_sqlite
            else self.engine.execution_options(isolation_level="AUTOCOMMIT")
        )

    # -- engines ------------------------------------------------------------------------------

    def _sqlite_engine(self, url: StorageURL) -> Engine:
        sa_url = _parse(url)
        query = dict(sa_url.query)
        database = sa_url.database or ""
        if database in ("", ":memory:") or database.startswith("file:"):
            raise ConfigurationError(
                f"storage URL {url.redacted!r}: SQLite storage needs a database file, such as "
                "sqlite:///.choreography/jobs.db; use memory:// for storage in memory"
            )
        synchronous = str(query.pop("synchronous", "NORMAL")).upper()
        if synchronous not in _SYNCHRONOUS:
            raise ConfigurationError(
                f"storage URL {url.redacted!r}: synchronous must be one of "
                f"{', '.join(_SYNCHRONOUS)}, got {synchronous!r}"
            )
        raw_timeout = query.pop("busy_timeout", DEFAULT_BUSY_TIMEOUT_MS)
        try:
            busy_timeout = int(str(raw_timeout))
            if busy_timeout < 0:
                raise ValueError
        except ValueError:
            raise ConfigurationError(
                f"storage URL {url.redacted!r}: busy_timeout must be a whole number of "
                f"milliseconds, got {raw_timeout!r}"
            ) from None
        if query:
            raise ConfigurationError(
                f"storage URL {url.redacted!r}: unknown SQLite option(s) "
                f"{', '.join(sorted(query))}; supported: synchronous, busy_timeout"
            )
        self.database_path = Path(database)
        sa_url = sa_url.set(drivername="sqlite+pysqlite", query=query)
        engine = self._sqlite_engine_for(sa_url, busy_timeout, synchronous, pool_size=2)
        # The inline engine never waits for the write lock: a call that finds it taken goes
        # to the provider's thread instead (see `run_quick`).
        self._inline_engine = self._sqlite_engine_for(sa_url, 0, synchronous, pool_size=1)
        return engine

    def _sqlite_engine_for(
        self, sa_url: URL, busy_timeout: int, synchronous: str, *, pool_size: int
    ) -> Engine:
        engine = create_engine(
            sa_url,
            connect_args={"timeout": busy_timeout / 1000, "check_same_thread": False},
            pool_size=pool_size,
            max_overflow=2,
            hide_parameters=True,  # errors and logs name the statement, not the records
        )
        path = self.database_path

        @event.listens_for(engine, "do_connect")
        def _make_directory(dialect: Any, record: Any, cargs: Any, cparams: Any) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)

        @event.listens_for(engine, "connect")
        def _configure(dbapi_connection: Any, record: Any) -> None:
            # The driver must not begin transactions on its own: a single statement commits by
            # itself, and `transaction()` begins with BEGIN IMMEDIATE, so that a write takes the
            # write lock at its start, where the busy timeout applies.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(f"PRAGMA busy_timeout = {busy_timeout}")
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute(f"PRAGMA synchronous = {synchronous}")
            finally:
                cursor.close()

        return engine

    def _postgres_engine(self, url: StorageURL, pool_size: int) -> Engine:
        sa_url = _parse(url)
        query = dict(sa_url.query)
        connect_args: dict[str, Any] = {}
        schema = query.pop("schema", None)
        if schema is not None:
            schema = str(schema)
            if not _SCHEMA_NAME.match(schema):
                raise ConfigurationError(
                    f"storage URL {url.redacted!r}: schema must be a plain identifier "
                    f"(letters, digits, underscores), got {schema!r}"
                )
            self.schema = schema
            extra = query.pop("options", None)
            options = f'-c search_path="{schema}"'
            connect_args["options"] = f"{extra} {options}" if extra else options
        sa_url = sa_url.set(drivername="postgresql+psycopg", query=query)
        return create_engine(
            sa_url,
            connect_args=connect_args,
            pool_size=pool_size,
            max_overflow=2,
            hide_parameters=True,  # errors and logs name the statement, not the records
        )

    # -- units of work ------------------------------------------------------------------------

    @contextmanager
    def transaction(self, *, defer_checkpoint: bool = False) -> Iterator[Connection]:
        """A connection in a write transaction, committed on success, rolled back otherwise.

        With `defer_checkpoint` (SQLite), the commit does not copy the write-ahead log into the
        database even if the log outgrew its limit; the worker does that after answering the
        call (`_checkpoint_if_due`), so a large batch does not wait for the copy and its syncs.
        """
        with self._engine().connect() as connection:
            if not self.is_sqlite:
                connection.begin()
                yield connection
                connection.commit()
                # On an error the connection closes uncommitted, which rolls back.
                return
            deferred = defer_checkpoint
            if deferred:
                connection.exec_driver_sql("PRAGMA wal_autocheckpoint = 0")
            try:
                connection.exec_driver_sql("BEGIN IMMEDIATE")
                yield connection
                connection.commit()
                self._checkpoint_due = self._checkpoint_due or deferred
            finally:
                if deferred:
                    self._restore_autocheckpoint(connection)

    @staticmethod
    def _restore_autocheckpoint(connection: Connection) -> None:
        try:
            if connection.in_transaction():
                connection.rollback()
            connection.exec_driver_sql(f"PRAGMA wal_autocheckpoint = {_AUTOCHECKPOINT_PAGES}")
        except Exception:  # never pool a connection that would not checkpoint
            connection.invalidate()

    def autocommit(self) -> Connection:
        """A connection whose every statement commits by itself: for reads and single writes.

        It saves the round trips of BEGIN and COMMIT where one statement is the whole unit.
        """
        if _INLINE.get():
            return self._inline_engine.connect()
        return self._autocommit_engine.connect()

    def _engine(self) -> Engine:
        return self._inline_engine if _INLINE.get() else self.engine

    async def run_quick(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a short unit of work (one record) at once on the event loop, where SQLite can.

        A single-row SQLite write takes tens of microseconds, less than handing it to a thread
        and back. It runs inline only while the provider's thread is idle (so it cannot
        overtake a call of this process) and on a connection that never waits for the write
        lock: if another process holds it, or anything transient goes wrong, the call goes to
        the thread, which waits and retries as usual. PostgreSQL calls always use threads.
        """
        for pause in _INLINE_RETRIES:
            if not (self.is_sqlite and self._calls.idle):
                break
            token = _INLINE.set(True)
            try:
                answer = fn(*args)
                if self._checkpoint_due and not self._housekeeping:
                    # A large batch left it. Copied off the provider's thread, so that the
                    # next batches still find the thread idle and run inline too.
                    self._housekeeping.add(task := asyncio.create_task(self._copy_log()))
                    task.add_done_callback(self._housekeeping.discard)
                return answer
            except Exception as error:
                if not self.is_transient(error):
                    raise
            finally:
                _INLINE.reset(token)
            # Another process holds the write lock, most often for a few milliseconds: wait
            # here rather than on the thread, where a busy loop makes a batch crawl.
            await asyncio.sleep(pause)
        return await self.run(fn, *args)

    async def _copy_log(self) -> None:
        """Run the checkpoint an inline batch left due, in a thread of its own."""
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._checkpoint_if_due)
        except Exception as error:  # closed meanwhile: the next open checkpoints
            log.debug("deferred SQLite checkpoint skipped: %s", error)

    async def housekeeping(self) -> None:
        """Wait for the background work inline calls left (the log copy); for tests."""
        while self._housekeeping:
            await asyncio.gather(*self._housekeeping, return_exceptions=True)

    async def run_read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a read at once on the event loop, where SQLite can, busy thread or not.

        In WAL mode a reader never waits for writers, and a read that starts while a write of
        this process is still queued is concurrent with it: it may see either side, as it
        would on any database. What a caller awaited before reading is committed and seen.
        The step records a worker loads for a batch of starts are read this way, so the
        starts are not queued behind the outcomes being written meanwhile.
        """
        if self.is_sqlite:
            token = _INLINE.set(True)
            try:
                return fn(*args)
            except Exception as error:
                if not self.is_transient(error):
                    raise
            finally:
                _INLINE.reset(token)
        return await self.run(fn, *args)

    def is_transient(self, error: BaseException) -> bool:
        return is_transient_error(error)

    # -- lifecycle ----------------------------------------------------------------------------

    async def initialize(self) -> None:
        if self._initialized:
            return
        await self.run(self._migrate)
        self._initialized = True

    def _migrate(self) -> None:
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.set_main_option("path_separator", "os")
        config.attributes["version_table"] = VERSION_TABLE
        with self.transaction() as connection:
            if not self.is_sqlite:
                # Serializes every process migrating this database (and schema) until commit.
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": self._lock_key()}
                )
                if self.schema is not None:
                    connection.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    def _checkpoint_if_due(self) -> None:
        """Run the SQLite checkpoint a large batch left for after its answer."""
        if not self._checkpoint_due:
            return
        self._checkpoint_due = False
        with self.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    def analyze_new_steps(self) -> None:
        """Gather PostgreSQL's statistics of the steps table if it has none yet.

        Without them, the planner of a fresh database takes (scope, namespace) to be selective
        and may update a step through a secondary index, reading every step of the partition,
        until autovacuum first analyzes the table (up to a minute). Called after large batches
        until the statistics are there; it costs a lookup, and an ANALYZE once.
        """
        try:
            with self.autocommit() as connection:
                known = connection.exec_driver_sql(
                    "SELECT reltuples FROM pg_class "
                    "WHERE oid = to_regclass('choreography_job_steps')"
                ).scalar()
                if known is not None and known < _ANALYZE_AFTER:
                    connection.exec_driver_sql("ANALYZE choreography_job_steps")
                    log.debug("analyzed the steps table of %s", self.url.redacted)
                else:
                    self._steps_have_statistics = True
        except sa_exc.DBAPIError as error:  # only an optimization; the write went through
            log.debug("could not analyze the steps table: %s", error)

    def _lock_key(self) -> int:
        name = f"choreography_ray.schema:{self.schema or ''}".encode()
        return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "big", signed=True)

    async def close(self) -> None:
        await self.housekeeping()
        await super().close()
        self.engine.dispose()
        if self.is_sqlite:
            self._inline_engine.dispose()

    def _open_partition(self, key: JobKey) -> JobsStorage:
        return JobsStorage(
            key=key,
            jobs=SqlJobStorage(self, key),
            steps=SqlJobStepStorage(self, key),
            plans=None,
        )


def _parse(url: StorageURL) -> URL:
    try:
        return make_url(url.raw)
    except (sa_exc.ArgumentError, ValueError):
        # The parser's message may quote the URL, password and all: leave it out.
        raise ConfigurationError(
            f"storage URL {url.redacted!r} is not a valid database URL"
        ) from None


class _Base:
    def __init__(self, provider: SqlStorage, key: JobKey) -> None:
        self.provider = provider
        self.key = key
        self._codec: RecordCodec = provider.codec
        self._sql = provider.sql
        self._run = provider.run
        self._quick = provider.run_quick
        self._read = provider.run_read


# --------------------------------------------------------------------------------------------
# Jobs


class SqlJobStorage(_Base):
    async def get(self, job_id: str) -> JobState:
        state = await self.find(job_id)
        if state is None:
            raise not_found_job(job_id, self.key)
        return state

    async def find(self, job_id: str) -> JobState | None:
        check_id(job_id, "job id")
        row = await self._quick(self._find, job_id)
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
        return await self._quick(self._save, state)

    def _save(self, state: JobState) -> int:
        document = self._codec.encode_job(state)
        scope, namespace = self.key.scope, self.key.namespace
        expected = state.version
        columns = (
            state.type,
            int(state.status),
            to_micros(state.created),
            state.stop_finalized,
        )
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
        return self._where(*conditions)

    async def query(self, query: JobQuery | None = None) -> list[JobState]:
        query = query or JobQuery()
        statement = (
            select(jobs_table.c.id, jobs_table.c.version, jobs_table.c.state)
            .where(self._matching(query))
            .order_by(jobs_table.c.created, jobs_table.c.id)
        )
        if query.skip:
            statement = statement.offset(query.skip)
        if query.take > 0:
            statement = statement.limit(query.take)
        return await self._run(self._decoded, statement)

    async def count(self, query: JobQuery | None = None) -> int:
        statement = (
            select(func.count()).select_from(jobs_table).where(self._matching(query or JobQuery()))
        )
        return await self._run(_scalar, self.provider, statement)

    async def get_jobs_excluding_finalized_stops(
        self, statuses: Iterable[JobStatus]
    ) -> list[JobState]:
        wanted = sorted({int(s) for s in statuses})
        if not wanted:
            return []
        statement = (
            select(jobs_table.c.id, jobs_table.c.version, jobs_table.c.state)
            .where(
                self._where(
                    jobs_table.c.status.in_(wanted),
                    not_(
                        and_(
                            jobs_table.c.status == int(JobStatus.STOPPED),
                            jobs_table.c.stop_finalized,
                        )
                    ),
                )
            )
            .order_by(jobs_table.c.created, jobs_table.c.id)
        )
        return await self._run(self._decoded, statement)

    def _decoded(self, statement: Any) -> list[JobState]:
        with self.provider.autocommit() as connection:
            rows = connection.execute(statement).all()
        decode = self._codec.decode_job_or_skip
        decoded = (decode(document, version, job_id) for job_id, version, document in rows)
        return [state for state in decoded if state is not None]


def _scalar(provider: SqlStorage, statement: Any) -> int:
    with provider.autocommit() as connection:
        return int(connection.execute(statement).scalar() or 0)


# --------------------------------------------------------------------------------------------
# Steps


class SqlJobStepStorage(_Base):
    async def get(self, job_id: str, step_id: str) -> JobStepState:
        state = await self.find(job_id, step_id)
        if state is None:
            raise not_found_step(job_id, step_id, self.key)
        return state

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
        run = self._quick if len(states) <= _QUICK_BATCH else self._run
        return await run(self._save_many, list(states))

    def _save_many(self, states: list[JobStepState]) -> list[int]:
        scope, namespace = self.key.scope, self.key.namespace
        encode = self._codec.encode_step
        inserts: list[tuple[Any, ...]] = []
        updates: list[tuple[Any, ...]] = []
        for state in states:
            document = encode(state)
            if state.version == 0:
                inserts.append(
                    (
                        scope,
                        namespace,
                        state.job_id,
                        state.id,
                        state.type,
                        state.name,
                        state.stage,
                        int(state.status),
                        document,
                    )
                )
            else:
                updates.append(
                    (
                        state.type,
                        state.name,
                        state.stage,
                        int(state.status),
                        state.version + 1,
                        document,
                        scope,
                        namespace,
                        state.job_id,
                        state.id,
                        state.version,
                    )
                )
        for _ in range(_BATCH_ATTEMPTS):
            if self._write_batch(inserts, updates):
                if len(inserts) >= _ANALYZE_AFTER and not self.provider._steps_have_statistics:
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
                insert = self._sql.insert_step
                if inserts and _execute(connection, insert, inserts) != len(inserts):
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
        if _execute(connection, self._sql.update_step_record, [_record_only(full)]):
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
        check_id(job_id, "job id")
        c = steps_table.c
        statement = (
            select(c.step_id, c.version, c.state)
            .where(self._where(job_id, statuses))
            .order_by(c.stage, c.step_id)
        )
        return await self._run(self._decoded, statement)

    def _decoded(self, statement: Any) -> list[JobStepState]:
        with self.provider.autocommit() as connection:
            rows = connection.execute(statement).all()
        decode = self._codec.decode_step_or_skip
        decoded = (decode(document, version, step_id) for step_id, version, document in rows)
        return [state for state in decoded if state is not None]

    async def count_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> int:
        check_id(job_id, "job id")
        statement = (
            select(func.count()).select_from(steps_table).where(self._where(job_id, statuses))
        )
        return await self._run(_scalar, self.provider, statement)

    async def count_by_status(self, job_id: str) -> dict[JobStepStatus, int]:
        check_id(job_id, "job id")
        c = steps_table.c
        statement = select(c.status, func.count()).where(self._where(job_id)).group_by(c.status)
        rows = await self._run(self._rows, statement)
        return {JobStepStatus(status): count for status, count in rows}

    def _rows(self, statement: Any) -> list[tuple[Any, ...]]:
        with self.provider.autocommit() as connection:
            return [tuple(row) for row in connection.execute(statement)]

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
        where = and_(self._where(job_id), steps_table.c.status.not_in(_KEPT_STEPS))
        return await self._run(self._delete, where)

    def _delete(self, where: ColumnElement[bool]) -> int:
        with self.provider.autocommit() as connection:
            return connection.execute(delete(steps_table).where(where)).rowcount


def _record_only(full: tuple[Any, ...]) -> tuple[Any, ...]:
    """The parameters of `update_step_record` from those of `update_step`."""
    type_, name, stage, status, version, document, scope, namespace, job_id, step_id, read = full
    return (name, stage, version, document, scope, namespace, job_id, step_id, read, status, type_)


class _Lost(Exception):
    """A compare-and-set of a batch lost: roll the transaction back."""


def _execute(connection: Connection, statement: str, rows: list[tuple[Any, ...]]) -> int:
    """Run `statement` once per row in one executemany; how many rows it changed."""
    if len(rows) == 1:
        return connection.exec_driver_sql(statement, rows[0]).rowcount
    return connection.exec_driver_sql(statement, rows).rowcount
