"""New step records go to SQL as statements of many rows, all or nothing per batch."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Engine, event

from choreography_ray.jobs import JobKey, JobStepState, TypeKind, TypeRegistry
from choreography_ray.jobs.errors import VersionConflictError
from choreography_ray.storage import open_storage
from choreography_ray.storage.sql.schema import INSERT_ROWS, Statements, rows_within

from .sql_support import drop_schema, with_schema
from .support import POSTGRES_ENV, env

KEY = JobKey(scope="sql", namespace="inserts")
COLUMNS = 11  # the parameters of one row of `insert_step`


class InsertStep:
    pass


def step(step_id: str) -> JobStepState:
    return JobStepState(id=step_id, job_id="job", type="sql.insert-step", position=0)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def provider(request, tmp_path, run):
    registry = TypeRegistry()
    registry.register(InsertStep, kind=TypeKind.STEP, name="sql.insert-step")
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
    else:
        base = env(POSTGRES_ENV)
        if base is None:
            pytest.skip(f"{POSTGRES_ENV} is not set")
        schema = f"choreo_inserts_{uuid.uuid4().hex[:12]}"
        url = with_schema(base, schema)
    provider = open_storage(url, registry=registry)
    try:
        run(provider.initialize())
        yield provider
    finally:
        run(provider.close())
        if schema is not None:
            drop_schema(base, schema)


def statements_run(run, action) -> list[tuple[str, int, bool]]:
    """The step inserts `action` ran: (statement, parameters, whether an executemany), on any
    of the provider's engines (SQLite runs small batches on one of the event loop's own)."""
    seen: list[tuple[str, int, bool]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if statement.startswith("INSERT INTO choreography_job_steps"):
            seen.append((statement, len(parameters), executemany))

    event.listen(Engine, "before_cursor_execute", capture)
    try:
        run(action())
    finally:
        event.remove(Engine, "before_cursor_execute", capture)
    return seen


def test_a_batch_of_new_records_is_a_few_statements_of_many_rows_on_sqlite(provider, run):
    storage = provider.for_key(KEY)
    states = [step(f"s{i:04d}") for i in range(1000)]
    seen = statements_run(run, lambda: storage.steps.save_many(states))
    if provider.is_sqlite:
        assert not any(executemany for _, _, executemany in seen)
        assert [count // COLUMNS for _, count, _ in seen] == [512, 256, 128, 64, 32, 8]
    else:  # psycopg pipelines an executemany, faster there than statements of many rows
        assert [(count, executemany) for _, count, executemany in seen] == [(1000, True)]
    assert run(storage.steps.count_for_job("job")) == 1000
    stored = {s.id: s for s in run(storage.steps.get_for_job("job"))}
    for state in states:
        assert stored[state.id].model_dump(exclude={"version"}) == state.model_dump(
            exclude={"version"}
        )
        assert stored[state.id].version == 1


def test_an_insert_that_loses_in_the_last_statement_writes_none_of_the_batch(provider, run):
    storage = provider.for_key(KEY)
    run(storage.steps.save_many([step("s0995")]))
    batch = [step(f"s{i:04d}") for i in range(1000)]  # s0995 is in the last, 8-row statement
    with pytest.raises(VersionConflictError) as raised:
        run(storage.steps.save_many(batch))
    assert raised.value.conflicts == ["s0995"]
    assert [s.id for s in run(storage.steps.get_for_job("job"))] == ["s0995"]


@pytest.mark.parametrize(
    ("limit", "rows"),
    [(250_000, 512), (32_766, 512), (5_632, 512), (5_631, 256), (999, 64), (11, 1)],
)
def test_a_statement_stays_within_the_library_s_bind_limit(limit, rows):
    assert rows_within(limit) == rows


def test_no_rows_is_no_statement():
    assert list(Statements("?", rows_per_insert=INSERT_ROWS).step_inserts([])) == []
    assert list(Statements("%s").step_inserts([])) == []


@pytest.mark.parametrize("rows", [1, 7, 511, 512, 513, 1000, 2000])
def test_the_statements_cover_every_row_once_in_order(rows):
    sql = Statements("?", rows_per_insert=INSERT_ROWS)
    given = [tuple(f"{n}.{c}" for c in range(COLUMNS)) for n in range(rows)]
    parts = [(text, values) for text, [values] in sql.step_inserts(given)]  # one row each
    sizes = [len(values) // COLUMNS for _, values in parts]
    assert all(size & (size - 1) == 0 and size <= INSERT_ROWS for size in sizes)
    assert sizes == sorted(sizes, reverse=True)
    assert [v for _, values in parts for v in values] == [v for row in given for v in row]
    for text, values in parts:
        assert text.count("?") == len(values)
    again = {len(values): text for text, [values] in sql.step_inserts(given)}
    assert all(again[len(values)] is text for text, values in parts)  # built once a size
    postgres = Statements("%s")
    assert list(postgres.step_inserts(given)) == [(postgres.insert_step, given)]
