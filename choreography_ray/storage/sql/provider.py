"""SQL storage (`sqlite:///path/jobs.db`, `postgresql+psycopg://user@host/db`).

One row per job and one per step, partitioned by (scope, namespace); the record itself is the
codec's JSON in `state`, next to the columns queries filter and order on. Writes are
compare-and-set on `version` in the statement itself (`WHERE version = :read`), so no lock is
held between a read and a write. A step batch is one transaction and one executemany per kind
of write, applied whole or not at all.

The schema is created and upgraded by Alembic in `initialize()`, under a lock, so that any
number of processes may initialize the same database at once.

On SQLite, writes of up to `QUICK_BATCH` records run on the event loop while the provider's
thread is idle, and step reads always do (`run_quick`, `run_read`; docs/decisions.md says why);
everything else runs on worker threads: one for SQLite (the database has one writer; a second
thread would only wait for the lock), four and a pool of four connections for PostgreSQL. A
statement that is a whole unit of work runs without BEGIN/COMMIT; a batch is one transaction
(BEGIN IMMEDIATE on SQLite, so it waits for the write lock up front, within the busy timeout).
Each unit is retried as a whole on a transient error.

The tables and statements are in `schema`, the engines and transient errors in `engines`,
the partition's record calls in `jobs`, `steps` and `plans` (modules of this package).

URL options (query parameters, removed before the URL reaches the driver):

* SQLite: `synchronous` (OFF, NORMAL, FULL or EXTRA; default NORMAL) and `busy_timeout`
  (milliseconds; default 5000). The database runs in WAL mode; its directory is created.
* PostgreSQL: `schema`, the schema the tables live in; created if missing. Always driven by
  psycopg 3, whatever driver the scheme names.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    select,
    text,
)
from sqlalchemy import exc as sa_exc

from ...jobs.errors import ConfigurationError
from ...jobs.options import JobsOptions
from ...jobs.registry import TypeRegistry
from ...jobs.state import JobKey
from ...jobs.status import JobStatus
from ..protocols import JobsStorage, StorageCapabilities
from ..provider import ThreadedProvider
from ..url import StorageURL
from .base import ANALYZE_AFTER
from .engines import is_transient_error, postgres_engine, sqlite_engines
from .jobs import SqlJobStorage, excluding_finalized_stops
from .plans import SqlStepPlanStorage
from .schema import (
    HEAD_REVISION,
    INSERT_ROWS,
    MIGRATIONS,
    VERSION_TABLE,
    Statements,
    jobs_table,
)
from .steps import SqlJobStepStorage

_INLINE_RETRIES = (0.001, 0.002, 0.004, 0.008)
"""Pauses between inline attempts that found the SQLite write lock taken; then the thread."""

_MISSED = object()
"""What an inline attempt returns when it must be made again (see `SqlStorage._inline`)."""

_INLINE: ContextVar[bool] = ContextVar("choreography_sqlite_inline", default=False)
"""Set while a call runs inline on the event loop: connections come from the inline engine."""

log = logging.getLogger("choreography_ray.storage")

_AUTOCHECKPOINT_PAGES = 1000  # SQLite's default

T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# The provider


class SqlStorage(ThreadedProvider):
    """Jobs and steps in SQLite or PostgreSQL, through SQLAlchemy Core."""

    capabilities: ClassVar[StorageCapabilities] = StorageCapabilities(
        external_step_plans=True,
        atomic_batches=True,
        shared_across_processes=True,
        partition_catalog=True,
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
            after_call_due=lambda: self._checkpoint_due,
        )
        self.schema: str | None = None
        self._initialized = False
        self._steps_have_statistics = self.is_sqlite
        self._checkpoint_due = False
        self._housekeeping: set[asyncio.Task[None]] = set()
        try:
            if self.is_sqlite:
                engines = sqlite_engines(url)
                self.engine, self._inline_engine = engines.engine, engines.inline
                self.database_path = engines.path
            else:
                self.engine, self.schema = postgres_engine(url, pool_size or threads)
        except BaseException:
            self._calls.shutdown()
            raise
        self.sql = (
            Statements("?", rows_per_insert=INSERT_ROWS) if self.is_sqlite else Statements("%s")
        )
        # SQLite connections run in the driver's autocommit mode already (see `_configure`).
        self._autocommit_engine = (
            self.engine
            if self.is_sqlite
            else self.engine.execution_options(isolation_level="AUTOCOMMIT")
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
        """Run a short unit of work (a record, or a batch of up to `QUICK_BATCH`) at once on
        the event loop, where SQLite can.

        A single-row SQLite write takes tens of microseconds, less than handing it to a thread
        and back, and a batch on the thread crawls behind a busy loop (docs/decisions.md). It
        runs inline only while the provider's thread is idle (so it cannot overtake a call of
        this process) and on a connection that never waits for the write lock: if another
        process holds it, the call waits `_INLINE_RETRIES` on the loop and tries again, then
        goes to the thread, which waits and retries as usual. PostgreSQL calls always use
        threads.
        """
        for pause in _INLINE_RETRIES:
            if not (self.is_sqlite and self._calls.idle):
                break
            answer = self._inline(fn, args)
            if answer is not _MISSED:
                if self._checkpoint_due and not self._housekeeping:
                    # A large batch left it. Copied off the provider's thread, so that the
                    # next batches still find the thread idle and run inline too.
                    self._housekeeping.add(task := asyncio.create_task(self._copy_log()))
                    task.add_done_callback(self._housekeeping.discard)
                return answer  # type: ignore[return-value]
            await asyncio.sleep(pause)
        return await self.run(fn, *args)

    def _inline(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T | object:
        """One attempt on the loop's own connection; `_MISSED` when it met something
        transient (most often another process holding the write lock)."""
        token = _INLINE.set(True)
        try:
            return fn(*args)
        except Exception as error:
            if not self.is_transient(error):
                raise
            return _MISSED
        finally:
            _INLINE.reset(token)

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
            answer = self._inline(fn, args)
            if answer is not _MISSED:
                return answer  # type: ignore[return-value]
        return await self.read(fn, *args)

    def is_transient(self, error: BaseException) -> bool:
        return is_transient_error(error)

    # -- lifecycle ----------------------------------------------------------------------------

    async def initialize(self) -> None:
        if self._initialized:
            return
        await self.run(self._migrate)
        self._initialized = True

    def _at_head(self) -> bool:
        """Whether the schema is already at this release's newest migration. Every process
        that opens the store asks: a host, a client, each command line. Checking through
        Alembic costs its import (about 80 ms of a command's second) and, on PostgreSQL, the
        migration lock; one read of the version table answers the usual case."""
        try:
            with self.autocommit() as connection:
                rows = connection.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}")
                return [row[0] for row in rows] == [HEAD_REVISION]
        except sa_exc.DBAPIError:
            return False  # no schema yet, or not one this read understands: Alembic decides

    def _migrate(self) -> None:
        if self._at_head():
            return
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
        if self._steps_have_statistics:
            return
        try:
            with self.autocommit() as connection:
                known = connection.exec_driver_sql(
                    "SELECT reltuples FROM pg_class "
                    "WHERE oid = to_regclass('choreography_job_steps')"
                ).scalar()
                if known is not None and known < ANALYZE_AFTER:
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

    async def keys_with_jobs(self, statuses: Iterable[JobStatus]) -> list[JobKey]:
        """One DISTINCT query over the jobs table.

        It reads `ix_choreography_jobs_stop` alone (scope, namespace, status, stop_finalized:
        every column it needs), all of it, since status is not the index's first column. An index
        led by status would read only the unfinished jobs, but every status change of every job
        would maintain it, for a query made once per recovery pass; docs/storage.md has the cost.
        """
        wanted = excluding_finalized_stops(statuses)
        if wanted is None:
            return []
        statement = (
            select(jobs_table.c.scope, jobs_table.c.namespace)
            .where(wanted)
            .distinct()
            .order_by(jobs_table.c.scope, jobs_table.c.namespace)
        )
        return await self.run(self._keys, statement)

    def _keys(self, statement: Any) -> list[JobKey]:
        with self.autocommit() as connection:
            rows = connection.execute(statement).all()
        return [JobKey(scope=scope, namespace=namespace) for scope, namespace in rows]

    def _open_partition(self, key: JobKey) -> JobsStorage:
        return JobsStorage(
            key=key,
            jobs=SqlJobStorage(self, key),
            steps=SqlJobStepStorage(self, key),
            plans=SqlStepPlanStorage(self, key),
        )
