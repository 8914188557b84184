"""One MongoDB partition: its collections, their indexes, and the base of its storages."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from bson.int64 import Int64
from pymongo import ASCENDING, DESCENDING, InsertOne, ReplaceOne
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import BulkWriteError, OperationFailure

from ...jobs.state import JobKey
from ..codec import RecordCodec
from ..job_order import stored_change
from .documents import raw_record

log = logging.getLogger("choreography_ray.storage")

T = TypeVar("T")

JOBS = "jobs"
STEPS = "job-steps"
PLANS = "job-step-plans"
PLAN_BATCH = 1_000
"""Plan entries inserted per round trip."""
DUPLICATE_KEY = 11000
_INDEX_CONFLICTS = frozenset({85, 86})
"""IndexOptionsConflict, IndexKeySpecsConflict: an equal index exists under another name."""

_INDEXES: dict[str, list[tuple[str, list[tuple[str, int]]]]] = {
    JOBS: [
        ("status", [("status", ASCENDING)]),
        ("type_status", [("type", ASCENDING), ("status", ASCENDING)]),
        (
            "status_created",
            [("status", ASCENDING), ("created", ASCENDING), ("_id", ASCENDING)],
        ),
        (
            "type_status_created",
            [
                ("type", ASCENDING),
                ("status", ASCENDING),
                ("created", ASCENDING),
                ("_id", ASCENDING),
            ],
        ),
        ("status_stopFinalized", [("status", ASCENDING), ("stopFinalized", ASCENDING)]),
        ("created", [("created", ASCENDING), ("_id", ASCENDING)]),
        ("changed", [("changed", ASCENDING), ("_id", ASCENDING)]),
    ],
    STEPS: [
        ("jobId_status", [("jobId", ASCENDING), ("status", ASCENDING)]),
        ("jobId_stepId", [("jobId", ASCENDING), ("stepId", ASCENDING)]),
        (
            "jobId_stage_stepId",
            [("jobId", ASCENDING), ("stage", ASCENDING), ("stepId", ASCENDING)],
        ),
        (
            "jobId_stage_position_stepId",
            [
                ("jobId", ASCENDING),
                ("stage", ASCENDING),
                ("position", ASCENDING),
                ("stepId", ASCENDING),
            ],
        ),
        (
            "jobId_changed_stepId",
            [("jobId", ASCENDING), ("changed", DESCENDING), ("stepId", DESCENDING)],
        ),
    ],
    PLANS: [
        (
            "jobId_incarnation_index",
            [("jobId", ASCENDING), ("incarnation", ASCENDING), ("ordinal", ASCENDING)],
        ),
    ],
}
"""Index name -> keys, per collection. Indexes found under other names are left in place."""


class MongoPartition:
    """The collections of one partition's database; creates their indexes on first use."""

    def __init__(self, database: Database[Any], *, mock: bool) -> None:
        self.database = database
        self.jobs: Collection[Any] = database[JOBS]
        self.steps: Collection[Any] = database[STEPS]
        self.plans: Collection[Any] = database[PLANS]
        self.mock = mock
        self._ready = False
        self._lock = threading.Lock()

    def write_steps(self, operations: list[tuple[dict[str, Any] | None, dict[str, Any]]]) -> Any:
        """One unordered bulk write of `(filter, document)` pairs: no filter inserts, else
        replaces; returns the bulk result's details, or raises `BulkWriteError`.

        Mongomock's bulk writes do not accept what current pymongo passes them, so there the
        operations run one by one (under the provider's lock), with the same details.
        """
        if not self.mock:
            requests: list[InsertOne[Any] | ReplaceOne[Any]] = [
                InsertOne(dict(document)) if filter is None else ReplaceOne(filter, document)
                for filter, document in operations
            ]
            return self.steps.bulk_write(requests, ordered=False).bulk_api_result
        details: dict[str, Any] = {"nInserted": 0, "nMatched": 0, "nModified": 0}
        errors: list[dict[str, Any]] = []
        for index, (filter, document) in enumerate(operations):
            try:
                if filter is None:
                    self.steps.insert_one(dict(document))
                    details["nInserted"] += 1
                else:
                    result = self.steps.replace_one(filter, document)
                    details["nMatched"] += result.matched_count
                    details["nModified"] += result.modified_count
            except OperationFailure as error:
                errors.append({"index": index, "code": error.code, "errmsg": str(error)})
        if errors:
            raise BulkWriteError({**details, "writeErrors": errors, "writeConcernErrors": []})
        return details

    def ensure_indexes(self) -> None:
        """Create the indexes once per process; creating an existing index changes nothing."""
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            for name, collection in ((JOBS, self.jobs), (STEPS, self.steps), (PLANS, self.plans)):
                for index_name, keys in _INDEXES[name]:
                    try:
                        collection.create_index(keys, name=index_name)
                    except OperationFailure as error:
                        if error.code not in _INDEX_CONFLICTS:
                            raise
                        log.warning(
                            "%s.%s: index %s exists in another form, keeping it: %s",
                            self.database.name,
                            name,
                            index_name,
                            error,
                        )
            self._backfill_changed()
            self._ready = True

    def _backfill_changed(self) -> None:
        """Give the jobs of earlier releases their last change, from their status history;
        a write racing this one keeps what it wrote (the update asks for no field)."""
        lacking = {"changed": {"$exists": False}}
        for document in self.jobs.find(lacking, {"created": 1, "state": 1}):
            created = document.get("created")
            created_us = int(created) if isinstance(created, int) else 0
            changed = stored_change(raw_record(document.get("state")), created_us)
            self.jobs.update_one(
                {"_id": document["_id"], **lacking}, {"$set": {"changed": Int64(changed)}}
            )


class PartitionCalls(Protocol):
    """What the records of a partition need of their provider (`MongoStorage`)."""

    codec: RecordCodec

    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...

    def call(self, partition: MongoPartition, fn: Callable[[], T]) -> T: ...


class MongoRecords:
    """The base of a partition's job, step and plan storages: one retried call per unit."""

    def __init__(self, provider: PartitionCalls, key: JobKey, partition: MongoPartition) -> None:
        self.key = key
        self._provider = provider
        self._p = partition
        self._codec: RecordCodec = provider.codec

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self._provider.run(self._provider.call, self._p, fn)
