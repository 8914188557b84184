"""Waiting, bounded, for something a cluster does in other processes (a node declared dead, a
job finished): the one wait the multi-node tests and benchmarks share, and the one read of a
job's records from storage they check it with."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from ..jobs.state import JobKey, JobState, JobStepState

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


def read_job(
    url: str, job_id: str, key: JobKey | None = None
) -> tuple[JobState | None, list[JobStepState]]:
    """A job's record and its step records, read from storage directly (a fault test reads
    storage, never a client: a client call would activate the job and hide whether recovery
    did). Blocking: it runs its own event loop."""
    from ..storage import open_storage

    async def read() -> tuple[JobState | None, list[JobStepState]]:
        async with open_storage(url) as provider:
            partition = provider.for_key(key or JobKey())
            job = await partition.jobs.find(job_id)
            return job, await partition.steps.get_all_for_job(job_id)

    return asyncio.run(read())
