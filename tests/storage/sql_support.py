"""How the contract suite opens the SQL provider: on SQLite files, and on a PostgreSQL server.

SQLite gets a fresh database file per test. PostgreSQL gets one schema per test run, named
after the process and a random suffix and dropped when the interpreter exits; tests stay apart
there by their random scopes. Raw writes insert rows with SQL, bypassing the codec.
"""

from __future__ import annotations

import atexit
import os
import threading
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from choreography_ray.jobs import JobKey, TypeRegistry
from choreography_ray.storage import StorageProvider, StorageURL

from .support import POSTGRES_ENV, env

RUN_SCHEMA = f"choreo_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
"""The PostgreSQL schema of this test run."""

_schema_lock = threading.Lock()
_schema_urls: set[str] = set()


def with_schema(url: str, schema: str) -> str:
    """`url` with its `schema` query parameter set to `schema`."""
    parts = urlsplit(url)
    query = [(name, value) for name, value in parse_qsl(parts.query) if name != "schema"]
    query.append(("schema", schema))
    return urlunsplit(parts._replace(query=urlencode(query)))


def drop_schema(url: str, schema: str) -> None:
    """Drop `schema` and everything in it from the database `url` names."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    sa_url = make_url(url)
    sa_url = sa_url.set(
        drivername="postgresql+psycopg",
        query={k: v for k, v in sa_url.query.items() if k != "schema"},
    )
    engine = create_engine(sa_url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        engine.dispose()


def _drop_run_schemas() -> None:
    with _schema_lock:
        urls = list(_schema_urls)
        _schema_urls.clear()
    for url in urls:
        try:
            drop_schema(url, RUN_SCHEMA)
        except Exception as error:  # pragma: no cover - the server went away; nothing to undo
            print(f"could not drop test schema {RUN_SCHEMA}: {type(error).__name__}")


def _remember(url: str) -> None:
    with _schema_lock:
        if not _schema_urls:
            atexit.register(_drop_run_schemas)
        _schema_urls.add(url)


async def _write_raw_job(
    provider: Any,
    key: JobKey,
    job_id: str,
    *,
    document: str,
    type: str,
    status: int,
    created_us: int,
) -> None:
    from sqlalchemy import insert

    from choreography_ray.storage.sql.schema import jobs_table

    statement = insert(jobs_table).values(
        scope=key.scope,
        namespace=key.namespace,
        id=job_id,
        type=type,
        status=status,
        created=created_us,
        stop_finalized=False,
        version=1,
        state=document,
    )
    await provider.run(_execute, provider, statement)


async def _write_raw_step(
    provider: Any, key: JobKey, job_id: str, step_id: str, *, document: str, status: int, stage: int
) -> None:
    from sqlalchemy import insert

    from choreography_ray.storage.sql.schema import steps_table

    statement = insert(steps_table).values(
        scope=key.scope,
        namespace=key.namespace,
        job_id=job_id,
        step_id=step_id,
        type="",
        name="",
        stage=stage,
        status=status,
        version=1,
        state=document,
    )
    await provider.run(_execute, provider, statement)


def _execute(provider: Any, statement: Any) -> None:
    with provider.transaction() as connection:
        connection.execute(statement)


class SqliteSupport:
    name = "sqlite"

    def available(self) -> str | None:
        return None

    def url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / f'jobs-{uuid.uuid4().hex[:8]}.db'}"

    async def open(self, tmp_path: Path, registry: TypeRegistry) -> StorageProvider:
        from choreography_ray.storage import open_storage

        provider = open_storage(self.url(tmp_path), registry=registry)
        await provider.initialize()
        return provider

    write_raw_job = staticmethod(_write_raw_job)
    write_raw_step = staticmethod(_write_raw_step)


class PostgresSupport:
    name = "postgres"

    def available(self) -> str | None:
        if env(POSTGRES_ENV) is None:
            return f"{POSTGRES_ENV} is not set"
        return None

    def url(self) -> StorageURL:
        """The server's URL, in this run's schema."""
        raw = env(POSTGRES_ENV)
        assert raw is not None
        _remember(raw)
        return StorageURL(with_schema(raw, RUN_SCHEMA))

    async def open(self, tmp_path: Path, registry: TypeRegistry) -> StorageProvider:
        from choreography_ray.storage import open_storage

        provider = open_storage(self.url(), registry=registry)
        await provider.initialize()
        return provider

    write_raw_job = staticmethod(_write_raw_job)
    write_raw_step = staticmethod(_write_raw_step)
