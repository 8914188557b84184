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


def pytest_itemcollected(item: pytest.Item) -> None:
    """Every test that starts Ray goes to one xdist group, so that no two Ray instances of
    the suite run at once (the machine has two cores, and some tests stop a Ray's control
    store or a node); the in-process tests run in the other process meanwhile. Marked as each
    test is collected: xdist reads the groups when the collection is modified."""
    path = Path(str(item.path))
    if RAY_TESTS in path.parents or path.parent == TESTS:
        item.add_marker(pytest.mark.xdist_group("ray"))


Run = Callable[[Coroutine[Any, Any, T]], T]


@pytest.fixture(scope="module")
def run() -> Iterator[Run[Any]]:
    """Runs a coroutine to completion on one loop shared by the module's tests."""
    with asyncio.Runner() as runner:
        yield runner.run
