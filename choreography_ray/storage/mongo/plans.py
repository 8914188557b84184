"""MongoDB step plans of one partition: one document per planned step, fenced by incarnation."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pymongo import ASCENDING

from ...jobs.state import PlannedStep
from ..codec import check_id
from .documents import raw_record, storable
from .partition import PLAN_BATCH, MongoRecords


class MongoStepPlanStorage(MongoRecords):
    async def save_plan(self, job_id: str, incarnation: int, steps: Sequence[PlannedStep]) -> None:
        """Delete this incarnation's earlier (possibly partial) attempt, then insert in batches.

        The whole of it is one retried unit: a retry starts again with the delete, and each
        entry's `_id` names its place in the plan, so no attempt can leave two copies of one.
        """
        check_id(job_id, "job id")
        entries = [storable(json.loads(self._codec.encode_planned(planned))) for planned in steps]
        plans = self._p.plans

        def write() -> None:
            plans.delete_many({"jobId": job_id, "incarnation": incarnation})
            for start in range(0, len(entries), PLAN_BATCH):
                plans.insert_many(
                    [
                        {
                            "_id": {"jobId": job_id, "incarnation": incarnation, "ordinal": n},
                            "jobId": job_id,
                            "incarnation": incarnation,
                            "ordinal": n,
                            "entry": entries[n],
                        }
                        for n in range(start, min(start + PLAN_BATCH, len(entries)))
                    ],
                    ordered=True,
                )

        await self._run(write)

    async def load_plan(self, job_id: str, incarnation: int) -> list[PlannedStep]:
        check_id(job_id, "job id")

        def read() -> list[PlannedStep]:
            cursor = self._p.plans.find(
                {"jobId": job_id, "incarnation": incarnation}, {"entry": 1, "_id": 0}
            ).sort("ordinal", ASCENDING)
            return [
                self._codec.decode_planned(raw_record(document.get("entry"))) for document in cursor
            ]

        return await self._run(read)

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
