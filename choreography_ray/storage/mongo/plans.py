"""MongoDB step plans of one partition: one document per planned step, fenced by incarnation."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence

from pymongo import ASCENDING

from ...jobs.state import PlannedStep
from ..codec import check_id
from ..protocols import PLAN_PART
from .documents import raw_record, storable
from .partition import PLAN_BATCH, MongoRecords


class MongoStepPlanStorage(MongoRecords):
    async def save_plan(self, job_id: str, incarnation: int, steps: Sequence[PlannedStep]) -> None:
        """Delete this incarnation's earlier (possibly partial) attempt, then insert in batches.

        The whole of it is one retried unit: a retry starts again with the delete, and each
        entry's `_id` names its place in the plan, so no attempt can leave two copies of one.
        """
        await self._save(job_id, incarnation, 0, steps, replace=True)

    async def append_plan(
        self, job_id: str, incarnation: int, position: int, steps: Sequence[PlannedStep]
    ) -> None:
        """A retry of the part first deletes what an interrupted attempt of it left."""
        await self._save(job_id, incarnation, position, steps, replace=False)

    async def _save(
        self,
        job_id: str,
        incarnation: int,
        position: int,
        steps: Sequence[PlannedStep],
        *,
        replace: bool,
    ) -> None:
        check_id(job_id, "job id")
        entries = [storable(json.loads(self._codec.encode_planned(planned))) for planned in steps]
        plans = self._p.plans
        this = {"jobId": job_id, "incarnation": incarnation}

        def write() -> None:
            plans.delete_many(this if replace else {**this, "ordinal": {"$gte": position}})
            for start in range(0, len(entries), PLAN_BATCH):
                plans.insert_many(
                    [
                        {
                            "_id": {"jobId": job_id, "incarnation": incarnation, "ordinal": n},
                            "jobId": job_id,
                            "incarnation": incarnation,
                            "ordinal": n,
                            "entry": entries[n - position],
                        }
                        for n in range(
                            position + start, position + min(start + PLAN_BATCH, len(entries))
                        )
                    ],
                    ordered=True,
                )

        await self._run(write)

    async def plan_parts(self, job_id: str, incarnation: int) -> AsyncIterator[list[PlannedStep]]:
        check_id(job_id, "job id")
        after = -1

        def read() -> list[PlannedStep]:
            nonlocal after
            cursor = (
                self._p.plans.find(
                    {"jobId": job_id, "incarnation": incarnation, "ordinal": {"$gt": after}},
                    {"entry": 1, "ordinal": 1, "_id": 0},
                )
                .sort("ordinal", ASCENDING)
                .limit(PLAN_PART)
            )
            documents = list(cursor)
            if documents:
                after = int(documents[-1]["ordinal"])
            return [
                self._codec.decode_planned(raw_record(document.get("entry")))
                for document in documents
            ]

        while part := await self._run(read):
            yield part

    async def delete_plan(self, job_id: str, incarnation: int) -> int:
        check_id(job_id, "job id")
        result = await self._run(
            lambda: self._p.plans.delete_many({"jobId": job_id, "incarnation": incarnation})
        )
        return result.deleted_count

    async def stored_plans(self, take: int) -> list[tuple[str, int]]:
        def read() -> list[tuple[str, int]]:
            groups = self._p.plans.aggregate(
                [
                    {"$group": {"_id": {"jobId": "$jobId", "incarnation": "$incarnation"}}},
                    {"$sort": {"_id.jobId": ASCENDING, "_id.incarnation": ASCENDING}},
                    {"$limit": take},
                ]
            )
            return [(group["_id"]["jobId"], int(group["_id"]["incarnation"])) for group in groups]

        return await self._run(read)
