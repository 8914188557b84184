"""SQLAlchemy engines for SQLite and PostgreSQL, from a storage URL, and which errors are
transient.

psycopg is imported only for PostgreSQL URLs: SQLite storage works without the `postgres`
extra.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url

from ...jobs.errors import ConfigurationError
from ..url import StorageURL

DEFAULT_BUSY_TIMEOUT_MS = 5_000
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


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
    psycopg = sys.modules.get("psycopg")  # not imported: the error cannot be one of its own
    if psycopg is not None and isinstance(error, psycopg.Error):
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
# SQLite


@dataclass(frozen=True)
class SqliteEngines:
    """The engine of the provider's threads, and the one calls made inline on the loop use."""

    engine: Engine
    inline: Engine
    """Never waits for the write lock: a call that finds it taken goes to the thread."""
    path: Path


def sqlite_engines(url: StorageURL) -> SqliteEngines:
    sa_url = parse_url(url)
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
    path = Path(database)
    sa_url = sa_url.set(drivername="sqlite+pysqlite", query=query)
    return SqliteEngines(
        engine=_sqlite_engine(sa_url, path, busy_timeout, synchronous, pool_size=2),
        inline=_sqlite_engine(sa_url, path, 0, synchronous, pool_size=1),
        path=path,
    )


def _sqlite_engine(
    sa_url: URL, path: Path, busy_timeout: int, synchronous: str, *, pool_size: int
) -> Engine:
    engine = create_engine(
        sa_url,
        connect_args={"timeout": busy_timeout / 1000, "check_same_thread": False},
        pool_size=pool_size,
        max_overflow=2,
        hide_parameters=True,  # errors and logs name the statement, not the records
    )

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


# --------------------------------------------------------------------------------------------
# PostgreSQL


def postgres_engine(url: StorageURL, pool_size: int) -> tuple[Engine, str | None]:
    """The engine, and the schema the URL names (None: the server's search path)."""
    sa_url = parse_url(url)
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
        extra = query.pop("options", None)
        options = f'-c search_path="{schema}"'
        connect_args["options"] = f"{extra} {options}" if extra else options
    sa_url = sa_url.set(drivername="postgresql+psycopg", query=query)
    engine = create_engine(
        sa_url,
        connect_args=connect_args,
        pool_size=pool_size,
        max_overflow=2,
        hide_parameters=True,  # errors and logs name the statement, not the records
    )
    return engine, schema


def parse_url(url: StorageURL) -> URL:
    try:
        return make_url(url.raw)
    except (sa_exc.ArgumentError, ValueError):
        # The parser's message may quote the URL, password and all: leave it out.
        raise ConfigurationError(
            f"storage URL {url.redacted!r} is not a valid database URL"
        ) from None
