"""The rows of an in-process store (`memory://`): what each partition holds, as the JSON the
other providers store, and what its storages share."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..jobs.state import JobKey
from .codec import RecordCodec
from .job_order import JobOrder
from .step_query import StepKey


@dataclass
class JobRow:
    version: int
    type: str
    status: int
    created_us: int
    stop_finalized: bool
    document: str
    changed_us: int = 0

    def order_key(self, job_id: str, order: JobOrder) -> tuple[int | str, ...]:
        if order == JobOrder.CHANGED:
            return (self.changed_us, job_id)
        if order == JobOrder.ID:
            return (job_id,)
        if order == JobOrder.STATUS:
            return (self.status, self.created_us, job_id)
        return (self.created_us, job_id)


@dataclass
class StepRow:
    version: int
    status: int
    stage: int
    document: str
    type: str = ""
    position: int = 0
    changed: int = 0
    _key: StepKey | None = None

    def key(self, step_id: str) -> StepKey:
        """Made at the row's first listing and kept: a write replaces the row."""
        if self._key is None:
            self._key = StepKey(
                step_id, self.stage, self.position, self.changed, self.status, self.type
            )
        return self._key


@dataclass
class Partition:
    jobs: dict[str, JobRow] = field(default_factory=dict)
    steps: dict[str, dict[str, StepRow]] = field(default_factory=dict)
    plans: dict[tuple[str, int], list[str]] = field(default_factory=dict)


@dataclass
class MemoryStore:
    lock: threading.RLock = field(default_factory=threading.RLock)
    partitions: dict[JobKey, Partition] = field(default_factory=dict)

    def partition(self, key: JobKey) -> Partition:
        with self.lock:
            return self.partitions.setdefault(key, Partition())


class PartitionPart:
    """What a partition's job, step and plan storages share: its rows, the store's lock and
    the codec."""

    def __init__(
        self, key: JobKey, partition: Partition, lock: threading.RLock, codec: RecordCodec
    ) -> None:
        self.key = key
        self._p = partition
        self._lock = lock
        self._codec = codec
