"""Waiting, bounded, for something a cluster does in other processes (a node declared dead, a
job finished): the one wait the multi-node tests and benchmarks share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], what: str, within: float, every: float = 0.1) -> T:
    """`check()`'s first truthy answer, asked every `every` seconds; `AssertionError` naming
    `what` once `within` seconds passed without one."""
    deadline = time.monotonic() + within
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        time.sleep(every)
