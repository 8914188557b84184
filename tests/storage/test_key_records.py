"""A concurrency key's record on every provider: admission is a compare-and-set on one step
record of a reserved job id, so it holds across hosts with no table of its own."""

from __future__ import annotations

import asyncio
from typing import Any

from choreography_ray.engine.concurrency import KEYS_JOB, admit
from choreography_ray.jobs import JobStatus


def test_a_key_admits_up_to_its_limit_and_frees_a_place_a_finished_job_held(
    run: Any, storage: Any, make: Any, registry: Any
) -> None:
    async def scenario() -> tuple[list[bool], bool, bool, list[str]]:
        jobs = [make.job(f"job-{n}") for n in range(4)]
        for job in jobs:
            job.version = await storage.jobs.save(job)
        first = [await admit(storage, registry, job.id, "tenant-a", 2) for job in jobs[:3]]
        again = await admit(storage, registry, "job-0", "tenant-a", 2)  # holds it already
        jobs[0].status = JobStatus.COMPLETED_SUCCESSFULLY
        await storage.jobs.save(jobs[0])
        freed = await admit(storage, registry, "job-2", "tenant-a", 2)
        record = await storage.steps.find(KEYS_JOB, "tenant-a")
        return first, again, freed, record.state.data["holders"]

    first, again, freed, holders = run(scenario())
    assert first == [True, True, False]
    assert again is True and freed is True
    assert holders == ["job-1", "job-2"]


def test_admissions_at_once_never_pass_the_limit(
    run: Any, storage: Any, make: Any, registry: Any
) -> None:
    async def scenario() -> tuple[int, list[str]]:
        jobs = [make.job(f"job-{n}") for n in range(6)]
        for job in jobs:
            await storage.jobs.save(job)
        answers = await asyncio.gather(*(admit(storage, registry, job.id, "k", 3) for job in jobs))
        record = await storage.steps.find(KEYS_JOB, "k")
        return sum(answers), record.state.data["holders"]

    admitted, holders = run(scenario())
    assert admitted <= 3 and len(holders) == admitted and len(set(holders)) == admitted
