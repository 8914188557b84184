"""MongoDB job records of one partition: reads, compare-and-set writes, queries."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from bson.int64 import Int64
from pymongo import ASCENDING, DESCENDING
from pymongo.errors import DuplicateKeyError

from ...jobs.errors import VersionConflictError
from ...jobs.state import JobState, to_micros
from ...jobs.status import TERMINAL_JOB_STATUSES, JobStatus
from ..codec import JobLookup, check_id, check_job_key
from ..job_order import JobOrder
from ..protocols import JobQuery
from ..step_query import PREFIX_END
from .documents import raw_record, storable, stored_version
from .partition import MongoRecords


def excluding_finalized_stops(statuses: Iterable[JobStatus]) -> dict[str, Any]:
    """The filter of jobs in `statuses` but not Stopped with a finalized stop; served by the
    `status_stopFinalized` index."""
    return {
        "status": {"$in": sorted({int(s) for s in statuses})},
        "$nor": [{"status": int(JobStatus.STOPPED), "stopFinalized": True}],
    }


def _ordering(query: JobQuery) -> list[tuple[str, int]]:
    """The query's order as sort keys, each descending when the query is."""
    fields = {
        JobOrder.CREATED: ["created", "_id"],
        JobOrder.CHANGED: ["changed", "_id"],
        JobOrder.ID: ["_id"],
        JobOrder.STATUS: ["status", "created", "_id"],
    }[query.order]
    direction = DESCENDING if query.descending else ASCENDING
    return [(name, direction) for name in fields]


class MongoJobStorage(JobLookup, MongoRecords):
    async def find(self, job_id: str) -> JobState | None:
        check_id(job_id, "job id")
        document = await self._run(lambda: self._p.jobs.find_one({"_id": job_id}))
        if document is None:
            return None
        return self._codec.decode_job(
            raw_record(document.get("state")), stored_version(document), job_id
        )

    async def save(self, state: JobState) -> int:
        check_id(state.id, "job id")
        check_job_key(state, self.key)
        job_id = state.id
        expected = state.version
        token = uuid.uuid4().hex
        document = {
            "_id": job_id,
            "type": state.type,
            "status": int(state.status),
            "created": Int64(to_micros(state.created)),
            "stopFinalized": state.stop_finalized,
            "changed": Int64(to_micros(state.last_change)),
            "version": Int64(expected + 1),
            "writeToken": token,
            "state": storable(self._codec.job_document(state)),
        }
        jobs = self._p.jobs

        def write() -> int:
            if expected == 0:
                try:
                    jobs.insert_one(dict(document))
                    return 1
                except DuplicateKeyError:
                    pass
            else:
                result = jobs.replace_one({"_id": job_id, "version": Int64(expected)}, document)
                if result.matched_count == 1:
                    return expected + 1
            stored = jobs.find_one({"_id": job_id}, {"version": 1, "writeToken": 1})
            if (
                stored is not None
                and stored.get("writeToken") == token
                and stored_version(stored) == expected + 1
            ):
                return expected + 1  # an earlier attempt of this call was applied
            found = stored_version(stored) if stored is not None else 0
            raise VersionConflictError(
                f"job {job_id!r}: stored version is {found}, write expected {expected}",
                [job_id],
            )

        return await self._run(write)

    async def remove(self, job_id: str) -> bool:
        check_id(job_id, "job id")
        result = await self._run(lambda: self._p.jobs.delete_one({"_id": job_id}))
        return result.deleted_count == 1

    async def remove_terminal(self, job_id: str) -> bool:
        check_id(job_id, "job id")
        terminal = sorted(int(s) for s in TERMINAL_JOB_STATUSES)
        result = await self._run(
            lambda: self._p.jobs.delete_one({"_id": job_id, "status": {"$in": terminal}})
        )
        return result.deleted_count == 1

    @staticmethod
    def _filter(query: JobQuery) -> dict[str, Any]:
        filter: dict[str, Any] = {}
        if query.type is not None:
            filter["type"] = query.type
        if query.statuses:
            filter["status"] = {"$in": sorted(int(s) for s in query.statuses)}
        for field, after, before in (
            ("created", query.created_after, query.created_before),
            ("changed", query.changed_after, query.changed_before),
        ):
            bounds: dict[str, Int64] = {}
            if before is not None:
                bounds["$lt"] = Int64(to_micros(before))
            if after is not None:
                bounds["$gte"] = Int64(to_micros(after))
            if bounds:
                filter[field] = bounds
        if query.id_prefix:
            filter["_id"] = {"$gte": query.id_prefix, "$lt": query.id_prefix + PREFIX_END}
        return filter

    def _decode_all(self, documents: Iterable[Mapping[str, Any]]) -> list[JobState]:
        decoded = (
            self._codec.decode_job_or_skip(
                raw_record(document.get("state")), stored_version(document), str(document["_id"])
            )
            for document in documents
        )
        return [state for state in decoded if state is not None]

    async def query(self, query: JobQuery | None = None) -> list[JobState]:
        query = query or JobQuery()
        filter = self._filter(query)

        def read() -> list[JobState]:
            cursor = self._p.jobs.find(filter, {"state": 1, "version": 1})
            cursor = cursor.sort(_ordering(query))
            if query.skip:
                cursor = cursor.skip(query.skip)
            if query.take > 0:
                cursor = cursor.limit(query.take)
            return self._decode_all(cursor)

        return await self._run(read)

    async def count(self, query: JobQuery | None = None) -> int:
        filter = self._filter(query or JobQuery())
        return await self._run(lambda: self._p.jobs.count_documents(filter))

    async def get_jobs_excluding_finalized_stops(
        self, statuses: Iterable[JobStatus]
    ) -> list[JobState]:
        filter = excluding_finalized_stops(statuses)

        def read() -> list[JobState]:
            cursor = self._p.jobs.find(filter, {"state": 1, "version": 1})
            return self._decode_all(cursor.sort([("created", ASCENDING), ("_id", ASCENDING)]))

        return await self._run(read)
