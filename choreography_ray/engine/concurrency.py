"""Concurrency keys, kept cluster-wide in storage: at most `max_running` jobs of one key run.

Each key of a partition has one record, the list of the jobs that hold it, written only by
compare-and-set: two controller hosts admitting at once cannot both take the last place, and
a host that dies takes nothing with it (the record is in storage, not in its memory). The
record is a step record of a reserved job id that no job can have (a job id has no `/`), so
every storage provider keeps it as it keeps steps, with no table of its own
(docs/decisions.md, "Concurrency keys").

A job is admitted once per execution generation, before it dispatches anything
(`key_gate.KeyGate`, from `Stages.advance`). A job that finds its key full waits, visibly
(`JobState.waiting_for_key`), and asks again every `concurrency_poll_interval`, or at once
when a job of its key on this host is admitted or finishes (`KeyWaiters`): on this host the
first to wait goes first, one job of each key in turn. A holder that no longer runs (finished,
stopped, removed, gone) is dropped from the record by the next job that needs its place: the
count is always what storage says runs.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field

from ..jobs.registry import Payload, TypeKind, TypeRegistry
from ..jobs.state import JobState, JobStepState
from ..jobs.status import RUNNING_JOB_STATUSES, JobStatus
from ..storage.protocols import JobsStorage
from .shared_records import save_shared

KEYS_JOB = "choreography/concurrency-keys"
"""The reserved job id whose step records are the keys' records."""

KEY_RECORD_TYPE = "choreography.concurrency-key"
HOLDERS_TYPE = "choreography.concurrency-holders"
_ATTEMPTS = 5
"""Compare-and-set attempts of one admission before it waits for the next turn."""


class KeyHolders(BaseModel):
    """A key's record: the jobs that hold it, in the order they were admitted."""

    holders: list[str] = Field(default_factory=list)


class KeyRecord:
    """The step type of a key's record: no step of this type is ever run."""


def _register(registry: TypeRegistry) -> None:
    registry.register(KeyRecord, kind=TypeKind.STEP, name=KEY_RECORD_TYPE)
    registry.register(KeyHolders, kind=TypeKind.STATE, name=HOLDERS_TYPE)


def holds(state: JobState | None) -> bool:
    """Whether a job holds its key's place: it may dispatch or still has steps to stop."""
    if state is None:
        return False
    status = state.status
    return (
        status in RUNNING_JOB_STATUSES
        or status == JobStatus.REMOVING
        or (status == JobStatus.STOPPED and not state.stop_finalized)
    )


async def admit(
    storage: JobsStorage,
    registry: TypeRegistry,
    job_id: str,
    key: str,
    limit: int,
    *,
    may_take: bool = True,
) -> bool:
    """Take a place of `key` for `job_id` by compare-and-set on the key's record; False while
    `limit` jobs that still run hold it (or the record kept changing under the attempts).
    A job that holds a place already has it (a recovered job); one that may not take a new
    place (`may_take`: another waits before it) gets none."""
    _register(registry)
    steps = storage.steps
    for _ in range(_ATTEMPTS):
        record = await steps.find(KEYS_JOB, key)
        holders = _holders(record)
        if job_id in holders:
            return True
        if not may_take:
            return False
        if len(holders) >= limit:
            found = await asyncio.gather(*(storage.jobs.find(holder) for holder in holders))
            holders = [h for h, state in zip(holders, found, strict=True) if holds(state)]
            if len(holders) >= limit:
                return False
        if await save_shared(
            steps,
            record,
            record_id=key,
            job_id=KEYS_JOB,
            record_type=KEY_RECORD_TYPE,
            state=_payload([*holders, job_id]),
        ):
            return True
        # another host admitted or cleaned up meanwhile: read again
    return False


def _holders(record: JobStepState | None) -> list[str]:
    if record is None or record.state is None:
        return []
    return KeyHolders.model_validate(record.state.data).holders


def _payload(holders: list[str]) -> Payload:
    return Payload(type=HOLDERS_TYPE, data=KeyHolders(holders=holders).model_dump(mode="json"))


class KeyWaiters:
    """The jobs of one partition waiting on this host for their keys, first come first, and
    what wakes them (one per engine context)."""

    def __init__(self) -> None:
        self._queues: dict[str, dict[str, None]] = {}
        self._wakes: dict[str, asyncio.Event] = {}

    def join(self, key: str, job_id: str) -> None:
        self._queues.setdefault(key, {})[job_id] = None

    def leave(self, key: str, job_id: str) -> None:
        queue = self._queues.get(key)
        if queue is not None:
            queue.pop(job_id, None)
            if not queue:
                del self._queues[key]

    def ahead(self, key: str, job_id: str) -> bool:
        """Whether another job waits here for `key` before `job_id`."""
        queue = self._queues.get(key)
        return queue is not None and next(iter(queue)) != job_id

    def poke(self, key: str) -> None:
        """A place of `key` may be free: its waiters here ask again now."""
        wake = self._wakes.pop(key, None)
        if wake is not None:
            wake.set()

    def woken(self, key: str) -> asyncio.Event:
        wake = self._wakes.get(key)
        if wake is None:
            wake = self._wakes[key] = asyncio.Event()
        return wake
