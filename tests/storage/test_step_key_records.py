"""A step-level concurrency key's places on every provider: taken and given back by
compare-and-set on one step record of a reserved job id, and a waiting step's record keeps
why it waits."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from choreography_ray.engine.step_keys import give_back, holders, renew, take
from choreography_ray.jobs.state import KeyWait


def test_places_taken_at_once_never_pass_the_limit_and_come_back(
    run: Any, storage: Any, registry: Any
) -> None:
    async def scenario() -> Any:
        def ask(host: str, now: float = 0.0) -> Any:
            runs = [f"{host}-{n}" for n in range(2)]
            return take(storage, registry, "k", limit=3, host=host, runs=runs, now=now, lease=10)

        got = await asyncio.gather(*(ask(f"h{n}") for n in range(4)))
        taken = sorted(run for runs in got for run in runs)
        host = taken[0].split("-")[0]
        mine = [run for run in taken if run.startswith(host)]
        await give_back(storage, registry, "k", host=host, runs=mine[:1])
        after_return = len(await holders(storage, registry, "k"))
        others = {run.split("-")[0] for run in taken} - {host}
        for other in others:  # they renew theirs, keeping none
            await renew(storage, registry, "k", host=other, holding=(), now=5, lease=10)
        kept = [place.run for place in await holders(storage, registry, "k")]
        return taken, mine, after_return, kept

    taken, mine, after_return, kept = run(scenario())
    assert len(taken) == 3 and len(set(taken)) == 3
    assert after_return == 2
    assert kept == mine[1:]


def test_a_waiting_step_record_keeps_why_it_waits(run: Any, storage: Any, make: Any) -> None:
    since = datetime(2026, 1, 1, tzinfo=UTC)

    async def scenario() -> Any:
        step = make.step("job-1", "s1")
        step.waiting_for_key = KeyWait(key="tenant-a", limit=2, since=since)
        await storage.steps.save(step)
        return await storage.steps.get("job-1", "s1")

    found = run(scenario())
    assert found.waiting_for_key == KeyWait(key="tenant-a", limit=2, since=since)
    assert found.waiting_for_key.text() == "waiting: key tenant-a at its limit 2"
