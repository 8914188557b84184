"""Shared fixtures: an event loop runner, so tests stay plain functions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

TESTS = Path(__file__).resolve().parent
RAY_TESTS = TESTS / "runtime"
"""Tests that start Ray (a local one or clusters): `tests/runtime/` and the top-level
modules, which run the examples, the documented commands and the deployment files."""


BESIDE = frozenset(
    {
        "test_fault_matrix.py",
        "test_control_plane_on_ray.py",
        "test_drains_on_ray.py",
        "test_scheduling_on_ray.py",
        "test_fault_matrix_postgres.py",
        "test_membership_on_ray.py",
        "test_placement_multinode.py",
        "test_placement_no_worker.py",
        "test_placement_waiting.py",
    }
)
"""Modules of `tests/runtime/` whose Ray is a `MultiNodeCluster` and nothing else: no Ray
started by `ray.init()` or `ray start`, no dashboard, no port of Ray's defaults, and Ray's
"current cluster" file left alone (`testing.ray_cluster`). They run one after another in a
group of their own, beside the other Ray tests, which may use those defaults."""


def pytest_itemcollected(item: pytest.Item) -> None:
    """The tests that start Ray go to two xdist groups, each one test after another (the
    machine has two cores, and some tests stop a Ray's control store or a node): `ray-beside`
    (the `BESIDE` modules) runs beside `ray` (the rest), so that one Ray instance of each may
    run at once, never two of the same kind; the in-process tests fill in around them. Marked
    as each test is collected: xdist reads the groups when the collection is modified."""
    path = Path(str(item.path))
    if path.parent == RAY_TESTS and path.name in BESIDE:
        item.add_marker(pytest.mark.xdist_group("ray-beside"))
    elif RAY_TESTS in path.parents or path.parent == TESTS:
        item.add_marker(pytest.mark.xdist_group("ray"))


Run = Callable[[Coroutine[Any, Any, T]], T]


@pytest.fixture(scope="module")
def run() -> Iterator[Run[Any]]:
    """Runs a coroutine to completion on one loop shared by the module's tests."""
    with asyncio.Runner() as runner:
        yield runner.run
