"""Shared fixtures: an event loop runner, so tests stay plain functions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

Run = Callable[[Coroutine[Any, Any, T]], T]


@pytest.fixture(scope="module")
def run() -> Iterator[Run[Any]]:
    """Runs a coroutine to completion on one loop shared by the module's tests."""
    with asyncio.Runner() as runner:
        yield runner.run
