"""Job records of earlier releases gain their last change when a new release opens the store:
the SQL migration 0004 and the MongoDB partition's first use read it from the status history."""

from __future__ import annotations

import sqlite3

from choreography_ray.jobs import StatusChange
from choreography_ray.jobs.state import to_micros
from choreography_ray.storage import JobOrder, JobQuery, open_storage
from choreography_ray.storage.sql import SqlStorage
from choreography_ray.storage.sql.schema import VERSION_TABLE

from .mongo_support import MongomockSupport


def _old_jobs(make):
    """Three jobs as an earlier release wrote them: no `changed`, one never changed status."""
    return [
        make.job("a", created=make.at(0), status_changes=[_at(make, 5)]),
        make.job("b", created=make.at(1), status_changes=[_at(make, 2), _at(make, 3)]),
        make.job("c", created=make.at(4)),
    ]


def _at(make, minute: int) -> StatusChange:
    return StatusChange(status=4, occurred=make.at(minute))


def _check_backfilled(run, storage, make) -> None:
    by_change = JobQuery(order=JobOrder.CHANGED)
    assert [j.id for j in run(storage.jobs.query(by_change))] == ["b", "c", "a"]
    assert [j.id for j in run(storage.jobs.query(JobQuery(changed_after=make.at(4))))] == [
        "a",
        "c",
    ]


def test_the_sql_upgrade_gives_old_rows_their_last_change(run, tmp_path, registry, make):
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
    with provider.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0003")
        for job in _old_jobs(make):
            connection.exec_driver_sql(
                "INSERT INTO choreography_jobs VALUES (?, ?, ?, ?, ?, ?, 0, 1, ?)",
                (
                    make.key.scope,
                    make.key.namespace,
                    job.id,
                    job.type,
                    int(job.status),
                    to_micros(job.created),
                    job.model_dump_json(exclude={"version", "changed"}),
                ),
            )
        connection.exec_driver_sql(  # a record that does not read keeps its creation time
            "INSERT INTO choreography_jobs VALUES ('s', 'n', 'bad', 't', 4, 7, 0, 1, '{')"
        )
    run(provider.close())
    provider = open_storage(f"sqlite:///{path}", registry=registry)
    run(provider.initialize())
    try:
        _check_backfilled(run, provider.for_key(make.key), make)
    finally:
        run(provider.close())
    with sqlite3.connect(path) as connection:
        assert connection.execute(
            "SELECT changed FROM choreography_jobs WHERE id = 'bad'"
        ).fetchall() == [(7,)]


def test_a_mongo_partition_gives_old_documents_their_last_change(run, tmp_path, registry, make):
    from choreography_ray.storage.mongo.partition import MongoPartition

    provider = run(MongomockSupport().open(tmp_path, registry))
    try:
        for job in _old_jobs(make):
            run(
                MongomockSupport.write_raw_job(
                    provider,
                    make.key,
                    job.id,
                    document=job.model_dump_json(exclude={"version", "changed"}),
                    type=job.type,
                    status=int(job.status),
                    created_us=to_micros(job.created),
                )
            )
        jobs = provider.partition(make.key).jobs
        assert jobs.count_documents({"changed": {"$exists": True}}) == 0
        MongoPartition(provider.partition(make.key).database, mock=True).ensure_indexes()
        assert jobs.count_documents({"changed": {"$exists": True}}) == 3
        _check_backfilled(run, provider.for_key(make.key), make)
    finally:
        run(provider.close())
