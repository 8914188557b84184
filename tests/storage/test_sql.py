"""What the SQL provider does beyond the contract: schema, SQLite settings, retries, URLs.

The contract suite (test_contract.py) checks the storage behaviour itself on SQLite and, when
CHOREOGRAPHY_TEST_POSTGRES_URL is set, on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import sys
import textwrap
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import event, inspect
from sqlalchemy import exc as sa_exc

from choreography_ray.jobs import (
    ConfigurationError,
    JobKey,
    JobsOptions,
    JobState,
    JobStatus,
    JobStepState,
    JobStepStatus,
    StorageUnavailableError,
    TypeKind,
    TypeRegistry,
    VersionConflictError,
)
from choreography_ray.storage import JobQuery, StepOrder, StepQuery, open_storage
from choreography_ray.storage.sql import SqlStorage
from choreography_ray.storage.sql.engines import is_transient_error
from choreography_ray.storage.sql.schema import HEAD_REVISION, INDEXES, VERSION_TABLE, metadata
from choreography_ray.storage.sql.steps import QUICK_BATCH

from .sql_support import drop_schema, with_schema
from .support import POSTGRES_ENV, env

KEY = JobKey(scope="sql", namespace="tests")


class SqlJob:
    pass


class SqlStep:
    pass


@pytest.fixture
def registry() -> TypeRegistry:
    registry = TypeRegistry()
    registry.register(SqlJob, kind=TypeKind.JOB, name="sql.job")
    registry.register(SqlStep, kind=TypeKind.STEP, name="sql.step")
    return registry


def job(job_id: str = "job", **changes) -> JobState:
    values = {
        "id": job_id,
        "key": KEY,
        "type": "sql.job",
        "created": datetime(2026, 1, 1, tzinfo=UTC),
    }
    values.update(changes)
    return JobState(**values)


def step(step_id: str, job_id: str = "job", **changes) -> JobStepState:
    return JobStepState(id=step_id, job_id=job_id, type="sql.step", **changes)


async def gather(*awaitables):
    return await asyncio.gather(*awaitables)


def sqlite_url(tmp_path: Path, name: str = "jobs.db") -> str:
    return f"sqlite:///{tmp_path / name}"


class Sleeps:
    """An injected `sleep` that records the delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@pytest.fixture
def sqlite_provider(tmp_path, registry, run):
    provider = open_storage(sqlite_url(tmp_path), registry=registry)
    run(provider.initialize())
    try:
        yield provider
    finally:
        run(provider.close())


def sqlite_connection(provider: SqlStorage) -> sqlite3.Connection:
    return sqlite3.connect(provider.database_path)


# -- schema ---------------------------------------------------------------------------------------


def test_initialize_twice_is_a_no_op(run, sqlite_provider):
    storage = sqlite_provider.for_key(KEY)
    run(storage.jobs.save(job()))
    run(sqlite_provider.initialize())
    sqlite_provider._initialized = False  # force the migration to run again
    run(sqlite_provider.initialize())
    assert run(storage.jobs.count()) == 1


def test_two_providers_initialize_one_sqlite_file_at_once(run, tmp_path, registry):
    providers = [open_storage(sqlite_url(tmp_path), registry=registry) for _ in range(4)]
    try:
        run(gather(*(provider.initialize() for provider in providers)))
        first, second = (provider.for_key(KEY) for provider in providers[:2])
        run(first.jobs.save(job()))
        assert run(second.jobs.get("job")).version == 1
        with pytest.raises(VersionConflictError):
            run(second.jobs.save(job()))
    finally:
        for provider in providers:
            run(provider.close())
    with sqlite3.connect(tmp_path / "jobs.db") as connection:
        assert connection.execute(f"SELECT count(*) FROM {VERSION_TABLE}").fetchone() == (1,)


def opening_script(url: str) -> str:
    """A new process that opens (and initializes) the store, then says whether it loaded
    Alembic."""
    return textwrap.dedent(
        f"""
        import asyncio, sys
        from choreography_ray.storage import open_storage

        async def main():
            provider = open_storage({url!r})
            await provider.initialize()
            await provider.close()

        asyncio.run(main())
        print("alembic" in sys.modules)
        """
    )


def test_processes_initialize_one_sqlite_file_at_once(tmp_path):
    script = opening_script(sqlite_url(tmp_path))
    processes = [
        subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
    with sqlite3.connect(tmp_path / "jobs.db") as connection:
        assert connection.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall() == [
            (HEAD_REVISION,)
        ]


def test_the_schema_version_is_recorded(sqlite_provider):
    with sqlite_connection(sqlite_provider) as connection:
        rows = connection.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall()
    assert rows == [(HEAD_REVISION,)]


def test_the_indexes_exist(sqlite_provider):
    inspector = inspect(sqlite_provider.engine)
    for table, indexes in INDEXES.items():
        found = {index["name"]: index["column_names"] for index in inspector.get_indexes(table)}
        assert found == indexes
    assert inspector.get_pk_constraint("choreography_job_steps")["constrained_columns"] == [
        "scope",
        "namespace",
        "job_id",
        "step_id",
    ]


def test_the_migrations_create_the_schema_queries_use(sqlite_provider):
    with sqlite_provider.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        assert compare_metadata(context, metadata) == []


def test_the_database_directory_is_created(run, tmp_path, registry):
    provider = open_storage(sqlite_url(tmp_path / "a" / "b"), registry=registry)
    try:
        run(provider.initialize())
    finally:
        run(provider.close())
    assert (tmp_path / "a" / "b" / "jobs.db").is_file()


def test_the_catalog_query_reads_only_the_covering_index_on_sqlite(run, sqlite_provider):
    statements: list[tuple[str, tuple]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        statements.append((statement, parameters))

    run(sqlite_provider.for_key(KEY).jobs.save(job(status=JobStatus.RUNNING)))
    event.listen(sqlite_provider.engine, "before_cursor_execute", capture)
    try:
        assert run(sqlite_provider.keys_with_jobs([JobStatus.RUNNING, JobStatus.STOPPED])) == [KEY]
    finally:
        event.remove(sqlite_provider.engine, "before_cursor_execute", capture)
    [(statement, parameters)] = [s for s in statements if "DISTINCT" in s[0]]
    with sqlite_connection(sqlite_provider) as connection:
        plan = connection.execute(f"EXPLAIN QUERY PLAN {statement}", parameters).fetchall()
    details = " | ".join(row[-1] for row in plan)
    assert "USING COVERING INDEX ix_choreography_jobs_stop" in details, details


# -- SQLite settings ------------------------------------------------------------------------------


def _pragmas(provider: SqlStorage) -> tuple[str, int, int]:
    with provider.engine.connect() as connection:
        return (
            connection.exec_driver_sql("PRAGMA journal_mode").scalar(),
            connection.exec_driver_sql("PRAGMA synchronous").scalar(),
            connection.exec_driver_sql("PRAGMA busy_timeout").scalar(),
        )


def test_sqlite_runs_in_wal_mode_with_normal_sync(sqlite_provider):
    assert _pragmas(sqlite_provider) == ("wal", 1, 5000)
    with sqlite_connection(sqlite_provider) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_sqlite_settings_come_from_the_url(run, tmp_path):
    provider = open_storage(sqlite_url(tmp_path) + "?synchronous=full&busy_timeout=250")
    try:
        run(provider.initialize())
        assert _pragmas(provider) == ("wal", 2, 250)
    finally:
        run(provider.close())


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///:memory:",
        "sqlite://",
        "sqlite:///x.db?synchronous=sometimes",
        "sqlite:///x.db?busy_timeout=soon",
        "sqlite:///x.db?synchronus=FULL",
        "postgresql://h/db?schema=bad-name",
        "postgresql://h/db?schema=x;drop",
        "postgresql://user:pw@h:port/db",
    ],
)
def test_unusable_urls_are_refused(url):
    with pytest.raises(ConfigurationError) as raised:
        open_storage(url)
    assert ":pw@" not in str(raised.value)


def test_sqlite_uses_one_thread_and_postgres_a_pool():
    sqlite = open_storage("sqlite:///unused/jobs.db")
    postgres = open_storage("postgresql://user@127.0.0.1:1/db")
    assert sqlite._calls._count == 1
    assert postgres._calls._count == 4
    assert postgres.engine.pool.size() == 4


# -- writes ---------------------------------------------------------------------------------------


def test_a_status_change_reaches_the_indexed_columns(run, sqlite_provider):
    # Writes that keep the indexed columns touch only the record; a status change must not.
    storage = sqlite_provider.for_key(KEY)
    state = job(status=JobStatus.RUNNING)
    state.version = run(storage.jobs.save(state))
    state.details = "same status"
    state.version = run(storage.jobs.save(state))
    state.status = JobStatus.STOPPED
    state.stop_finalized = True
    state.version = run(storage.jobs.save(state))
    assert state.version == 3
    assert run(storage.jobs.count(JobQuery(statuses={JobStatus.STOPPED}))) == 1
    assert run(storage.jobs.get_jobs_excluding_finalized_stops([JobStatus.STOPPED])) == []

    single = step("s1", status=JobStepStatus.SCHEDULED)
    single.version = run(storage.steps.save(single))
    single.name = "renamed"
    single.version = run(storage.steps.save(single))
    single.status = JobStepStatus.FAILED
    single.version = run(storage.steps.save(single))
    assert single.version == 3
    assert run(storage.steps.count_by_status("job")) == {JobStepStatus.FAILED: 1}
    assert run(storage.steps.get("job", "s1")).name == "renamed"


def test_a_mixed_batch_that_loses_writes_nothing(run, sqlite_provider):
    storage = sqlite_provider.for_key(KEY)
    existing = [step(f"old{i}") for i in range(3)]
    run(storage.steps.save_many(existing))
    batch = [step(f"new{i}") for i in range(3)]
    for index, state in enumerate(existing):
        state.version = 1 if index != 1 else 7
        batch.append(state)
    batch.append(step("old2"))  # an insert of a step that exists
    batch.pop(-2)  # ...instead of its update
    with pytest.raises(VersionConflictError) as raised:
        run(storage.steps.save_many(batch))
    assert raised.value.conflicts == ["old1", "old2"]
    assert run(storage.steps.count_for_job("job")) == 3
    assert {s.version for s in run(storage.steps.get_for_job("job"))} == {1}


def test_ten_thousand_steps_save_in_one_batch(run, sqlite_provider):
    storage = sqlite_provider.for_key(KEY)
    states = [step(f"s{i:05d}", stage=i % 3) for i in range(10_000)]
    assert run(storage.steps.save_many(states)) == [1] * 10_000
    for state in states:
        state.version = 1
        state.status = JobStepStatus.RUNNING
    assert run(storage.steps.save_many(states)) == [2] * 10_000
    assert run(storage.steps.count_by_status("job")) == {JobStepStatus.RUNNING: 10_000}


def test_a_large_batch_leaves_the_checkpoint_for_after_its_answer(run, sqlite_provider):
    storage = sqlite_provider.for_key(KEY)
    database = sqlite_provider.database_path
    before = database.stat().st_size
    states = [step(f"s{i:05d}", name="x" * 200) for i in range(2000)]
    run(storage.steps.save_many(states))
    run(sqlite_provider.housekeeping())  # the log is copied after the batch's answer
    assert database.stat().st_size > before + 500_000
    assert sqlite_provider._checkpoint_due is False

    states[7].version = 3
    with pytest.raises(VersionConflictError):
        run(storage.steps.save_many([*states, step("new")]))
    with sqlite_provider.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 1000


# -- transient errors -----------------------------------------------------------------------------


def _invalidated() -> sa_exc.OperationalError:
    return sa_exc.OperationalError(
        "SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True
    )


class Flaky:
    """Fails with `error()` the first `failures` calls, then answers "done"."""

    def __init__(self, failures: int, error=_invalidated) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error()
        return "done"


def _provider(tmp_path, sleeps: Sleeps, attempts: int = 4) -> SqlStorage:
    options = JobsOptions(transient_retry_attempts=attempts)
    provider = open_storage(sqlite_url(tmp_path), options=options, sleep=sleeps)
    assert isinstance(provider, SqlStorage)
    return provider


def test_transient_errors_are_retried(run, tmp_path):
    sleeps = Sleeps()
    provider = _provider(tmp_path, sleeps)
    try:
        flaky = Flaky(3)
        assert run(provider.run(flaky)) == "done"
        assert flaky.calls == 4
        assert len(sleeps.delays) == 3
    finally:
        run(provider.close())


def test_transient_errors_give_up_after_the_attempts(run, tmp_path, caplog):
    sleeps = Sleeps()
    provider = _provider(tmp_path, sleeps, attempts=3)
    try:
        flaky = Flaky(10)
        with caplog.at_level(logging.WARNING), pytest.raises(StorageUnavailableError):
            run(provider.run(flaky))
        assert flaky.calls == 3
        assert len(sleeps.delays) == 2
        assert "transient error on attempt 1" in caplog.text
    finally:
        run(provider.close())


def test_other_errors_surface_at_once(run, tmp_path):
    sleeps = Sleeps()
    provider = _provider(tmp_path, sleeps)
    integrity = Flaky(
        5, lambda: sa_exc.IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE"))
    )
    try:
        with pytest.raises(sa_exc.IntegrityError):
            run(provider.run(integrity))
        assert integrity.calls == 1
        assert sleeps.delays == []
    finally:
        run(provider.close())


def test_a_locked_database_is_waited_for_and_retried(run, tmp_path, registry, caplog):
    url = sqlite_url(tmp_path) + "?busy_timeout=20"
    locker = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None, check_same_thread=False)

    def release(delay: float) -> None:
        if locker.in_transaction:
            locker.execute("COMMIT")

    provider = open_storage(url, registry=registry, sleep=release)
    try:
        run(provider.initialize())
        locker.execute("BEGIN IMMEDIATE")
        with caplog.at_level(logging.WARNING):
            assert run(provider.for_key(KEY).jobs.save(job())) == 1
        assert not locker.in_transaction
        assert "database is locked" in caplog.text
        assert "status_changes" not in caplog.text  # the record is not logged
    finally:
        run(provider.close())
        locker.close()


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (_invalidated(), True),
        (sa_exc.OperationalError("x", {}, sqlite3.OperationalError("database is locked")), True),
        (sa_exc.OperationalError("x", {}, sqlite3.OperationalError("database is busy")), True),
        (sa_exc.OperationalError("x", {}, sqlite3.OperationalError("no such table: t")), False),
        (sa_exc.OperationalError("x", {}, psycopg.OperationalError("connection failed")), True),
        (sa_exc.OperationalError("x", {}, psycopg.errors.SerializationFailure("retry")), True),
        (sa_exc.OperationalError("x", {}, psycopg.errors.QueryCanceled("timeout")), True),
        (sa_exc.OperationalError("x", {}, psycopg.errors.AdminShutdown("bye")), True),
        (sa_exc.IntegrityError("x", {}, psycopg.errors.UniqueViolation("dup")), False),
        (sa_exc.ProgrammingError("x", {}, psycopg.errors.UndefinedTable("t")), False),
        (sa_exc.ProgrammingError("x", {}, psycopg.OperationalError("odd")), False),
        (sa_exc.TimeoutError("QueuePool limit reached"), True),
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (VersionConflictError("lost", ["a"]), False),
        (ValueError("bad id"), False),
    ],
)
def test_which_errors_are_transient(error, transient):
    assert is_transient_error(error) is transient


# -- URLs, secrets and capabilities ---------------------------------------------------------------


SECRET_URL = "postgresql://chor:s3cr3t-pw@127.0.0.1:1/jobs?schema=choreo&connect_timeout=2"


def test_the_password_stays_out_of_reprs():
    provider = open_storage(SECRET_URL)
    for text in (repr(provider), str(provider), repr(provider.url), str(provider.url)):
        assert "s3cr3t-pw" not in text
        assert "***" in text
    assert "s3cr3t-pw" not in repr(provider.engine)


def test_the_password_stays_out_of_logs_and_errors(run, caplog):
    options = JobsOptions(transient_retry_attempts=2)
    provider = open_storage(SECRET_URL, options=options, sleep=Sleeps())
    try:
        with caplog.at_level(logging.DEBUG), pytest.raises(StorageUnavailableError) as raised:
            run(provider.initialize())
    finally:
        run(provider.close())
    assert "transient error" in caplog.text
    assert "s3cr3t-pw" not in caplog.text
    assert "s3cr3t-pw" not in str(raised.value)


def test_postgres_urls_use_psycopg_3_and_keep_the_schema_to_themselves():
    provider = open_storage("postgresql://user@db.example:5432/jobs?schema=tenant_a&sslmode=prefer")
    url = provider.engine.url
    assert url.drivername == "postgresql+psycopg"
    assert dict(url.query) == {"sslmode": "prefer"}
    assert provider.schema == "tenant_a"


def test_sql_storage_stores_large_plans_apart(sqlite_provider):
    assert sqlite_provider.for_key(KEY).plans is not None
    capabilities = sqlite_provider.capabilities
    assert capabilities.external_step_plans
    assert capabilities.atomic_batches
    assert capabilities.shared_across_processes


def test_a_database_of_the_first_schema_gains_the_plan_table_and_keeps_its_jobs(run, tmp_path):
    """A database created by the release before plans were stored apart is upgraded in place."""
    from alembic import command
    from alembic.config import Config

    from choreography_ray.storage.sql.schema import MIGRATIONS

    path = tmp_path / "old.db"
    provider = open_storage(f"sqlite:///{path}")
    assert isinstance(provider, SqlStorage)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    config.attributes["version_table"] = VERSION_TABLE
    with provider.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0001")
        connection.exec_driver_sql(
            "INSERT INTO choreography_jobs VALUES ('s', 'n', 'old', 't', 0, 0, 0, 1, '{}')"
        )
    run(provider.close())
    with sqlite3.connect(path) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        assert "choreography_step_plans" not in tables
    provider = open_storage(f"sqlite:///{path}")
    run(provider.initialize())
    run(provider.close())
    with sqlite3.connect(path) as connection:
        assert connection.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall() == [
            (HEAD_REVISION,)
        ]
        assert connection.execute("SELECT id FROM choreography_jobs").fetchall() == [("old",)]
        assert connection.execute("SELECT count(*) FROM choreography_step_plans").fetchall() == [
            (0,)
        ]


def test_steps_of_the_plan_schema_list_by_stage_and_id_after_the_upgrade(run, tmp_path, registry):
    """Step rows written before plan positions were kept read and page as before: position 0,
    no last change, the plan order falling back to stage and id."""
    from alembic import command
    from alembic.config import Config

    from choreography_ray.storage.sql.schema import MIGRATIONS

    path = tmp_path / "old.db"
    provider = open_storage(f"sqlite:///{path}", registry=registry)
    assert isinstance(provider, SqlStorage)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    config.attributes["version_table"] = VERSION_TABLE
    old = [step(f"s{n}", stage=1 - n % 2) for n in range(4)]
    with provider.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0002")
        for state in old:
            connection.exec_driver_sql(
                "INSERT INTO choreography_job_steps VALUES (?, ?, ?, ?, ?, '', ?, ?, 1, ?)",
                (
                    KEY.scope,
                    KEY.namespace,
                    state.job_id,
                    state.id,
                    state.type,
                    state.stage,
                    int(state.status),
                    state.model_dump_json(exclude={"version", "position"}),
                ),
            )
    run(provider.close())
    provider = open_storage(f"sqlite:///{path}", registry=registry)
    run(provider.initialize())
    try:
        steps = provider.for_key(KEY).steps
        pages = []
        query = StepQuery(take=3)
        while True:
            page = run(steps.query(old[0].job_id, query))
            pages.append([s.id for s in page.steps])
            if page.next is None:
                break
            query = query.model_copy(update={"after": page.next})
        assert pages == [["s1", "s3", "s0"], ["s2"]]
        by_change = run(steps.query(old[0].job_id, StepQuery(order=StepOrder.CHANGED)))
        assert [s.id for s in by_change.steps] == ["s3", "s2", "s1", "s0"]
    finally:
        run(provider.close())


def test_a_closed_provider_refuses_calls(run, tmp_path):
    provider = open_storage(sqlite_url(tmp_path))
    run(provider.initialize())
    run(provider.close())
    run(provider.close())
    with pytest.raises(RuntimeError):
        run(provider.for_key(KEY).jobs.count())


# -- PostgreSQL -----------------------------------------------------------------------------------

postgres = pytest.mark.skipif(env(POSTGRES_ENV) is None, reason=f"{POSTGRES_ENV} is not set")


@pytest.fixture
def fresh_schema():
    """A schema of its own, dropped after the test."""
    base = env(POSTGRES_ENV)
    assert base is not None
    schema = f"choreo_sqltest_{uuid.uuid4().hex[:12]}"
    try:
        yield with_schema(base, schema), schema
    finally:
        drop_schema(base, schema)


@pytest.mark.postgres
@postgres
def test_postgres_providers_create_one_schema_at_once(run, fresh_schema, registry):
    url, schema = fresh_schema
    providers = [open_storage(url, registry=registry) for _ in range(4)]
    try:
        run(gather(*(provider.initialize() for provider in providers)))
        run(providers[0].initialize())
        first, second = (provider.for_key(KEY) for provider in providers[:2])
        run(first.jobs.save(job()))
        assert run(second.jobs.get("job")).version == 1
    finally:
        for provider in providers:
            run(provider.close())
    with psycopg.connect(_libpq(url)) as connection:
        tables = connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        ).fetchall()
        version = connection.execute(
            f'SELECT version_num FROM "{schema}".{VERSION_TABLE}'
        ).fetchall()
    assert sorted(name for (name,) in tables) == [
        VERSION_TABLE,
        "choreography_job_steps",
        "choreography_jobs",
        "choreography_step_plans",
    ]
    assert version == [(HEAD_REVISION,)]


@pytest.mark.postgres
@postgres
def test_postgres_indexes_and_schema_match(run, fresh_schema):
    url, _ = fresh_schema
    provider = open_storage(url)
    try:
        run(provider.initialize())
        inspector = inspect(provider.engine)
        for table, indexes in INDEXES.items():
            found = {i["name"]: i["column_names"] for i in inspector.get_indexes(table)}
            assert found == indexes
        with provider.engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
            assert compare_metadata(context, metadata) == []
    finally:
        run(provider.close())


@pytest.mark.postgres
@postgres
def test_postgres_orders_ids_bytewise(run, fresh_schema, registry):
    url, _ = fresh_schema
    provider = open_storage(url, registry=registry)
    try:
        run(provider.initialize())
        storage = provider.for_key(KEY)
        ids = ["b", "B", "a", "A", "_", "a-1", "a_1", "é"]
        run(storage.steps.save_many([step(i) for i in ids]))
        assert [s.id for s in run(storage.steps.get_for_job("job"))] == sorted(ids)
    finally:
        run(provider.close())


@pytest.mark.postgres
@postgres
def test_postgres_connections_dropped_by_the_server_are_retried(run, fresh_schema, registry):
    url, _ = fresh_schema
    name = f"choreo_drop_{uuid.uuid4().hex[:12]}"
    sleeps = Sleeps()
    provider = open_storage(f"{url}&application_name={name}", registry=registry, sleep=sleeps)
    try:
        run(provider.initialize())
        storage = provider.for_key(KEY)
        run(storage.jobs.save(job()))
        with psycopg.connect(_libpq(url), autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (name,),
            ).fetchone()
        assert killed is not None and killed[0] >= 1
        assert run(storage.jobs.get("job")).version == 1
        assert len(sleeps.delays) >= 1
    finally:
        run(provider.close())


def _libpq(url: str) -> str:
    from sqlalchemy.engine import make_url

    sa_url = make_url(url)
    return sa_url.set(drivername="postgresql", query={}).render_as_string(hide_password=False)


def test_writes_up_to_a_batch_limit_run_inline_and_larger_batches_on_the_thread(
    run, sqlite_provider
):
    submitted = []
    real = sqlite_provider._calls.submit

    def spy(fn, *args):
        submitted.append(args[0].__name__ if args else fn.__name__)
        return real(fn, *args)

    sqlite_provider._calls.submit = spy
    storage = sqlite_provider.for_key(KEY)
    assert run(storage.jobs.save(job())) == 1
    assert run(storage.steps.save(step("one"))) == 1
    run(storage.steps.save_many([step(f"s{n}") for n in range(QUICK_BATCH)]))
    assert submitted == []  # no thread hop: the GIL is not handed back and forth per row
    run(sqlite_provider.housekeeping())
    run(storage.steps.save_many([step(f"t{n}") for n in range(QUICK_BATCH + 1)]))
    assert submitted == ["_save_many"]


def test_an_inline_write_that_finds_the_database_locked_goes_to_the_thread(run, tmp_path, registry):
    provider = open_storage(sqlite_url(tmp_path), registry=registry)
    locker = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None, check_same_thread=False)

    async def scenario():
        await provider.initialize()
        locker.execute("BEGIN IMMEDIATE")
        saving = asyncio.ensure_future(provider.for_key(KEY).jobs.save(job()))
        for _ in range(5):
            await asyncio.sleep(0)
        waiting = not saving.done()  # the thread waits for the lock; the loop does not
        locker.execute("COMMIT")
        return waiting, await saving

    try:
        waiting, version = run(scenario())
        assert waiting and version == 1
    finally:
        run(provider.close())
        locker.close()


class _Locked:
    """A SQLite provider whose inline attempts retry without a pause, beside a connection
    that can hold the write lock; it notes each inline attempt (True: it missed the lock) and
    calls `after_attempt` after each one."""

    def __init__(self, tmp_path: Path, registry, monkeypatch) -> None:
        from choreography_ray.storage.sql import provider as sql_provider

        monkeypatch.setattr(sql_provider, "_INLINE_RETRIES", (0, 0, 0, 0))  # loop turns only
        self.provider = open_storage(sqlite_url(tmp_path), registry=registry)
        self.locker = sqlite3.connect(
            tmp_path / "jobs.db", isolation_level=None, check_same_thread=False
        )
        self.storage = self.provider.for_key(KEY)
        self.missed: list[bool] = []
        self.after_attempt = lambda: None
        inline = self.provider._inline

        def attempt(fn, args):
            answer = inline(fn, args)
            self.missed.append(answer is sql_provider._MISSED)
            self.after_attempt()
            return answer

        monkeypatch.setattr(self.provider, "_inline", attempt)

    async def while_locked(self, write):
        """`write`'s answer, the lock held through every inline attempt and the thread's start."""
        await self.provider.initialize()
        self.locker.execute("BEGIN IMMEDIATE")
        saving = asyncio.ensure_future(write())
        for _ in range(20):  # every inline attempt, then the thread's, which waits for the lock
            await asyncio.sleep(0)
        self.locker.execute("COMMIT")
        return await saving

    def close(self, run) -> None:
        run(self.provider.close())
        self.locker.close()


def _counted(monkeypatch, owner, name: str, into: list) -> None:
    """Note a copy of each record `owner.name` encodes, as it was then."""
    real = getattr(owner, name)

    def counting(record):
        into.append(record.model_copy())
        return real(record)

    monkeypatch.setattr(owner, name, counting)


def test_a_batch_that_meets_the_lock_on_the_loop_is_encoded_once(
    run, tmp_path, registry, monkeypatch
):
    """An inline attempt that finds another process holding the write lock is made again, up
    to four times, and then on the thread: encoding, most of a batch's cost, is done once."""
    locked = _Locked(tmp_path, registry, monkeypatch)
    steps = locked.storage.steps
    encoded: list[JobStepState] = []
    _counted(monkeypatch, steps._codec, "encode_step", encoded)
    try:
        versions = run(locked.while_locked(lambda: steps.save_many([step("a"), step("b")])))
        assert locked.missed[:4] == [True, True, True, True]
        assert versions == [1, 1]
        assert sorted(state.id for state in encoded) == ["a", "b"]
        assert [state.id for state in run(steps.get_all_for_job("job"))] == ["a", "b"]
    finally:
        locked.close(run)


def test_a_job_record_that_meets_the_lock_is_written_as_its_first_attempt_took_it(
    run, tmp_path, registry, monkeypatch
):
    """Its text and its columns are taken once, by the first attempt: the attempts made again
    (and the thread's) write the same, encoded once, even when the state moved meanwhile, so
    the status column and the record's own status never disagree."""
    locked = _Locked(tmp_path, registry, monkeypatch)
    jobs = locked.storage.jobs
    encoded: list[JobStatus] = []
    _counted(monkeypatch, jobs._codec, "encode_job", encoded)
    state = job()

    def moved() -> None:  # after the first attempt took the state
        if locked.missed[-1] and state.status == JobStatus.RUNNING:
            state.status = JobStatus.STOPPED

    async def scenario():
        await locked.provider.initialize()
        state.version = await jobs.save(state)
        encoded.clear()
        state.status = JobStatus.RUNNING
        locked.after_attempt = moved
        return await locked.while_locked(lambda: jobs.save(state))

    try:
        assert run(scenario()) == 2
        assert locked.missed[-4:] == [True, True, True, True]
        assert [record.status for record in encoded] == [JobStatus.RUNNING]
        with sqlite3.connect(tmp_path / "jobs.db") as db:
            column, text = db.execute("SELECT status, state FROM choreography_jobs").fetchone()
        assert column == int(JobStatus.RUNNING)
        assert JobState.model_validate_json(text).status == JobStatus.RUNNING
    finally:
        locked.close(run)


def test_a_count_from_the_columns_trusts_a_malformed_record_s_status_and_a_verified_one_does_not(
    run, sqlite_provider, tmp_path
):
    """The price of counting without reading: a record spoiled inside while its columns stay
    sound is counted by its stored status. Only reading every record tells it apart."""
    storage = sqlite_provider.for_key()
    run(storage.steps.save_many([step("s1", status=JobStepStatus.FAILED), step("s2")]))
    with sqlite3.connect(tmp_path / "jobs.db") as db:
        db.execute("UPDATE choreography_job_steps SET state = '{not json' WHERE step_id = 's2'")
    quick = run(storage.steps.count_by_status("job", verify=False))
    assert (dict(quick), quick.unreadable, quick.verified) == (
        {JobStepStatus.FAILED: 1, JobStepStatus.UNKNOWN: 1},
        0,
        False,
    )
    read = run(storage.steps.count_by_status("job"))
    assert (dict(read), read.unreadable, read.verified) == ({JobStepStatus.FAILED: 1}, 1, True)


def test_the_head_revision_the_quick_check_knows_is_alembic_s_head():
    """Adding a migration without moving `HEAD_REVISION` would make every open of an
    up-to-date store run Alembic again, and of an older one skip nothing: this keeps them one."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from choreography_ray.storage.sql.schema import HEAD_REVISION, MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    assert ScriptDirectory.from_config(config).get_heads() == [HEAD_REVISION]


def test_opening_a_store_already_at_head_reads_its_version_and_never_loads_alembic(tmp_path):
    """A command that only reads opens the store: Alembic's import was a tenth of its time."""
    code = opening_script(sqlite_url(tmp_path))
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (first.stdout.strip(), again.stdout.strip()) == ("True", "False")
