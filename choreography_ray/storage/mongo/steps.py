"""MongoDB step records of one partition: reads, batched compare-and-set writes, removal."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bson.int64 import Int64
from pymongo import ASCENDING, DESCENDING
from pymongo.errors import BulkWriteError

from ...jobs.errors import VersionConflictError
from ...jobs.state import JobStepState
from ...jobs.status import JobStepStatus
from ..codec import StepLookup, StepRecord, check_batch, check_id
from ..protocols import STEP_PART, StepCounts, StepPart, check_take
from ..step_query import (
    PREFIX_END,
    StepKey,
    StepOrder,
    StepPage,
    StepQuery,
    changed_micros,
    paged,
)
from .documents import raw_record, step_key, storable, stored_version
from .partition import DUPLICATE_KEY, PLAN_BATCH, MongoRecords


class MongoJobStepStorage(StepLookup, MongoRecords):
    async def find(self, job_id: str, step_id: str) -> JobStepState | None:
        check_id(job_id, "job id")
        check_id(step_id, "step id")
        document = await self._run(
            lambda: self._p.steps.find_one({"_id": step_key(job_id, step_id)})
        )
        if document is None:
            return None
        return self._codec.decode_step(
            raw_record(document.get("state")), stored_version(document), step_id
        )

    async def get_many(self, job_id: str, step_ids: Sequence[str]) -> list[JobStepState]:
        check_id(job_id, "job id")
        wanted = [check_id(step_id, "step id") for step_id in step_ids]

        def read() -> list[JobStepState]:
            found: dict[str, JobStepState] = {}
            for start in range(0, len(wanted), PLAN_BATCH):
                keys = [step_key(job_id, step_id) for step_id in wanted[start : start + PLAN_BATCH]]
                for document in self._p.steps.find(
                    {"_id": {"$in": keys}}, {"stepId": 1, "state": 1, "version": 1}
                ):
                    step_id = str(document.get("stepId"))
                    state = self._codec.decode_step_or_skip(
                        raw_record(document.get("state")), stored_version(document), step_id
                    )
                    if state is not None:
                        found[step_id] = state
            return [found[step_id] for step_id in wanted if step_id in found]

        return await self._run(read)

    async def save(self, state: JobStepState) -> int:
        return (await self.save_many([state]))[0]

    async def save_many(self, states: Sequence[JobStepState]) -> list[int]:
        if not states:
            return []
        pairs = check_batch(states)
        token = uuid.uuid4().hex
        expected = [state.version for state in states]
        documents = [
            {
                "_id": step_key(state.job_id, state.id),
                "jobId": state.job_id,
                "stepId": state.id,
                "status": int(state.status),
                "stage": state.stage,
                "type": state.type,
                "position": state.position,
                "changed": Int64(changed_micros(state)),
                "version": Int64(state.version + 1),
                "writeToken": token,
                "state": storable(self._codec.step_document(state)),
            }
            for state in states
        ]

        def write() -> list[int]:
            operations = [
                (
                    None if version == 0 else {"_id": document["_id"], "version": Int64(version)},
                    document,
                )
                for document, version in zip(documents, expected, strict=True)
            ]
            try:
                details = self._p.write_steps(operations)
            except BulkWriteError as error:
                details = error.details
                unexpected = [
                    e for e in details.get("writeErrors", ()) if e.get("code") != DUPLICATE_KEY
                ]
                if unexpected or details.get("writeConcernErrors"):
                    raise
            suspects = {int(e["index"]) for e in details.get("writeErrors", ())}
            replaces = [i for i, version in enumerate(expected) if version != 0]
            if details.get("nMatched", 0) < len(replaces):
                suspects.update(replaces)
            conflicts = self._conflicts(sorted(suspects), pairs, expected, token)
            if conflicts:
                lost = set(conflicts)
                raise VersionConflictError(
                    f"{len(conflicts)} step record(s) changed since they were read "
                    f"(first: {conflicts[0]!r}); the other records of the batch were written",
                    conflicts,
                    applied={
                        state.id: version + 1
                        for state, version in zip(states, expected, strict=True)
                        if state.id not in lost
                    },
                )
            return [version + 1 for version in expected]

        return await self._run(write)

    def _conflicts(
        self,
        suspects: list[int],
        pairs: list[tuple[str, str]],
        expected: list[int],
        token: str,
    ) -> list[str]:
        """The step ids among `suspects` that this call did not write."""
        if not suspects:
            return []
        stored: dict[tuple[str, str], Mapping[str, Any]] = {}
        for start in range(0, len(suspects), PLAN_BATCH):
            ids = [step_key(*pairs[i]) for i in suspects[start : start + PLAN_BATCH]]
            for document in self._p.steps.find(
                {"_id": {"$in": ids}}, {"jobId": 1, "stepId": 1, "version": 1, "writeToken": 1}
            ):
                stored[(document.get("jobId"), document.get("stepId"))] = document
        conflicts = []
        for i in suspects:
            document = stored.get(pairs[i])
            applied = (
                document is not None
                and document.get("writeToken") == token
                and stored_version(document) == expected[i] + 1
            )
            if not applied:
                conflicts.append(pairs[i][1])
        return conflicts

    @staticmethod
    def _filter(job_id: str, statuses: Iterable[JobStepStatus] | None) -> dict[str, Any]:
        check_id(job_id, "job id")
        filter: dict[str, Any] = {"jobId": job_id}
        if statuses is not None:
            filter["status"] = {"$in": sorted({int(s) for s in statuses})}
        return filter

    def _records(self, filter: dict[str, Any]) -> list[StepRecord]:
        """(step id, version, record) of the steps `filter` matches, by stage and id."""
        cursor = self._p.steps.find(filter, {"stepId": 1, "state": 1, "version": 1})
        cursor = cursor.sort([("stage", ASCENDING), ("stepId", ASCENDING)])
        return [
            (
                str(document.get("stepId")),
                stored_version(document),
                raw_record(document.get("state")),
            )
            for document in cursor
        ]

    async def get_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> list[JobStepState]:
        filter = self._filter(job_id, statuses)
        return await self._run(
            lambda: self._codec.decode_steps(job_id, self._records(filter), strict=False)
        )

    async def get_all_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> list[JobStepState]:
        filter = self._filter(job_id, statuses)
        return await self._run(
            lambda: self._codec.decode_steps(job_id, self._records(filter), strict=True)
        )

    async def part_for_job(
        self, job_id: str, after: str | None = None, take: int = STEP_PART
    ) -> StepPart:
        filter = self._filter(job_id, None)
        check_take(take)
        if after is not None:
            filter["stepId"] = {"$gt": after}

        def part() -> StepPart:
            cursor = self._p.steps.find(filter, {"stepId": 1, "state": 1, "version": 1})
            cursor = cursor.sort([("stepId", ASCENDING)]).limit(take)
            rows = [
                (str(d.get("stepId")), stored_version(d), raw_record(d.get("state")))
                for d in cursor
            ]
            return self._codec.step_part(rows, take)

        return await self._run(part)

    async def count_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> int:
        filter = self._filter(job_id, statuses)
        return await self._run(lambda: self._p.steps.count_documents(filter))

    def _query_filter(self, job_id: str, query: StepQuery) -> dict[str, Any]:
        """The job's steps the query's filter keeps, after its cursor. A document of an
        earlier release has no position, last change or type: it sorts first of its stage in
        plan order and last by last change, its cursor matching it as 0."""
        filter = self._filter(job_id, query.statuses or None)
        if query.stage is not None:
            filter["stage"] = query.stage
        if query.type is not None:
            filter["type"] = query.type
        if query.id_prefix:
            filter["stepId"] = {"$gte": query.id_prefix, "$lt": query.id_prefix + PREFIX_END}
        after = query.after
        if after is not None:
            if after.order is StepOrder.PLAN:
                stage, position = after.stage, _same(after.position)
                filter["$or"] = [
                    {"stage": {"$gt": stage}},
                    {"stage": stage, "position": {"$gt": after.position}},
                    {"stage": stage, "position": position, "stepId": {"$gt": after.step_id}},
                ]
            else:
                filter["$or"] = [
                    {"changed": {"$lt": after.changed}},
                    {"changed": _same(after.changed), "stepId": {"$lt": after.step_id}},
                ]
                if after.changed != 0:  # a lacking field compares with no number
                    filter["$or"].append({"changed": None})
        return filter

    async def query(self, job_id: str, query: StepQuery | None = None) -> StepPage:
        query = query or StepQuery()
        filter = self._query_filter(job_id, query)
        if query.order is StepOrder.PLAN:
            order = [("stage", ASCENDING), ("position", ASCENDING), ("stepId", ASCENDING)]
        else:
            order = [("changed", DESCENDING), ("stepId", DESCENDING)]
        fields = {f: 1 for f in ("stepId", "stage", "position", "changed", "status", "type")}

        def read() -> StepPage:
            cursor = self._p.steps.find(filter, {**fields, "state": 1, "version": 1}).sort(order)
            if query.limit is not None:
                cursor = cursor.limit(query.limit + 1)
            rows = [(_key(document), document) for document in cursor]
            page, following = paged(rows, query, lambda row: row[0])
            records: list[StepRecord] = [
                (key.step_id, stored_version(d), raw_record(d.get("state"))) for key, d in page
            ]
            return StepPage(self._codec.decode_steps(job_id, records, strict=False), following)

        return await self._run(read)

    async def count(self, job_id: str, query: StepQuery | None = None) -> int:
        unpaged = (query or StepQuery()).model_copy(update={"after": None})
        filter = self._query_filter(job_id, unpaged)
        return await self._run(lambda: self._p.steps.count_documents(filter))

    async def count_by_status(self, job_id: str, *, verify: bool = True) -> StepCounts:
        """With `verify`, reads every record: only reading tells a readable one from one that
        is not; else groups the documents by their status field on the server."""
        filter = self._filter(job_id, None)
        if verify:
            return await self._run(lambda: self._codec.count_steps(self._records(filter)))
        pipeline = [{"$match": filter}, {"$group": {"_id": "$status", "n": {"$sum": 1}}}]

        def grouped() -> StepCounts:
            rows = self._p.steps.aggregate(pipeline)
            return self._codec.count_statuses(
                (r["_id"] if isinstance(r["_id"], int) else -1, int(r["n"])) for r in rows
            )

        return await self._run(grouped)

    async def remove(self, job_id: str, step_id: str) -> bool:
        check_id(job_id, "job id")
        check_id(step_id, "step id")
        result = await self._run(
            lambda: self._p.steps.delete_one({"_id": step_key(job_id, step_id)})
        )
        return result.deleted_count == 1

    async def remove_all_for_job(self, job_id: str) -> int:
        filter = self._filter(job_id, None)
        result = await self._run(lambda: self._p.steps.delete_many(filter))
        return result.deleted_count

    async def remove_all_non_failed_for_job(self, job_id: str) -> int:
        """The steps not failed, then the failed ones that cannot be read; one retried unit,
        which a retry repeats harmlessly."""
        filter = self._filter(job_id, None)
        kept = sorted(int(s) for s in (JobStepStatus.FAILED, JobStepStatus.COMPLETED_WITH_FAILURE))
        steps = self._p.steps

        def remove() -> int:
            removed = steps.delete_many({**filter, "status": {"$nin": kept}}).deleted_count
            _, unreadable = self._codec.sort_steps(self._records(filter))
            doomed = list(unreadable)
            for start in range(0, len(doomed), PLAN_BATCH):
                keys = [step_key(job_id, step_id) for step_id in doomed[start : start + PLAN_BATCH]]
                removed += steps.delete_many({"_id": {"$in": keys}}).deleted_count
            return removed

        return await self._run(remove)


def _same(value: int) -> Any:
    """Equal to `value`, where 0 is also a field a document of an earlier release lacks."""
    return {"$in": [0, None]} if value == 0 else value


def _number(document: Mapping[str, Any], field: str) -> int:
    value = document.get(field)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def _key(document: Mapping[str, Any]) -> StepKey:
    return StepKey(
        step_id=str(document.get("stepId")),
        stage=_number(document, "stage"),
        position=_number(document, "position"),
        changed=_number(document, "changed"),
        status=_number(document, "status"),
        type=str(document.get("type") or ""),
    )
