"""The fault matrix over PostgreSQL (the server CI runs): the whole cluster restarted over the
same database (case 6), and the database unavailable while recovery runs, then back (case 7).

A database of this run's own, created and dropped here; skipped without
CHOREOGRAPHY_TEST_POSTGRES_URL (CI sets it and fails when these did not run).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .test_fault_matrix import (
    MODULE,
    OPTIONS,
    _another_controller,
    _check_recovered,
    _owner_node,
    _run_until_fault,
)

URL = os.environ.get("CHOREOGRAPHY_TEST_POSTGRES_URL")

pytestmark = pytest.mark.skipif(URL is None, reason="CHOREOGRAPHY_TEST_POSTGRES_URL is not set")

STEPS = 600


def _admin(sql: str) -> None:
    import sqlalchemy

    assert URL is not None
    engine = sqlalchemy.create_engine(URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text(sql))
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def database() -> Iterator[tuple[str, str]]:
    """(storage URL, database name) of a database of this module's own."""
    assert URL is not None
    name = f"choreography_faults_{os.getpid()}"
    _admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    _admin(f"CREATE DATABASE {name}")
    try:
        yield URL.rsplit("/", 1)[0] + f"/{name}", name
    finally:
        _admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="module")
def cluster(database) -> Iterator[Any]:
    from choreography_ray.testing import MultiNodeCluster

    with MultiNodeCluster(
        database[0],
        nodes=("none", "controller", "controller", "worker"),
        modules=[MODULE],
        options=OPTIONS,
    ) as running:
        yield running


def test_postgres_the_whole_cluster_restarted_at_forty_percent(cluster, database, tmp_path):
    url = database[0]
    fault = _run_until_fault(cluster, url, tmp_path, steps=STEPS, at=0.4)
    fault.at = time.monotonic()
    cluster.restart()  # every process killed; the layout started again over the same database
    _check_recovered(url, fault, "whole cluster restarted (PostgreSQL)", steps=STEPS)


def test_postgres_unavailable_while_recovery_runs_then_back(cluster, database, tmp_path):
    """The owning controller's node dies while the database refuses every connection: the
    recovery pass fails and is retried (1 s doubling); once the database is back the job is
    taken over and completes."""
    url, name = database
    fault = _run_until_fault(cluster, url, tmp_path, steps=STEPS)
    owner = _owner_node(url, fault.job_id)
    _admin(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
    try:
        _admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        )
        assert cluster.remove_node(owner) == owner
        fault.at = time.monotonic()
        time.sleep(6)  # the outage itself (not a wait for a timeout): recovery runs into it
    finally:
        _admin(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
    _check_recovered(url, fault, "database down during recovery (PostgreSQL)", steps=STEPS)
    assert _owner_node(url, fault.job_id) != owner
    _another_controller(cluster)
