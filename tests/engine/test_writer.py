"""The group commit tells each waiter of a record's change once it is durable, directly."""

from __future__ import annotations

import asyncio
import logging

from choreography_ray.bench import NoopStep
from choreography_ray.engine.clock import FakeClock
from choreography_ray.engine.writer import StaleRecord, StepWriter, Tracked
from choreography_ray.jobs.retry import Backoff
from choreography_ray.jobs.state import JobKey, JobStepState
from choreography_ray.storage.schemes import open_storage


def _writer(storage) -> StepWriter:
    return StepWriter(JobKey(), storage, clock=FakeClock(), backoff=Backoff(0.01, 0.1))


def test_every_waiter_of_a_batch_is_told_once_durable_even_after_one_that_raises(caplog):
    async def scenario():
        storage = open_storage("memory://writer-waiters").for_key(JobKey())
        writer = _writer(storage)
        told: list[tuple[str, BaseException | None]] = []

        def waiter(name: str, fails: bool = False):
            def then(error: BaseException | None) -> None:
                told.append((name, error))
                if fails:
                    raise RuntimeError(f"{name} broke")

            return then

        records = [
            Tracked(JobStepState(id=f"s{i}", job_id="j", type=NoopStep.name)) for i in range(3)
        ]
        writer.write(records[0], waiter("first", fails=True))
        writer.write(records[1], waiter("second"))
        writer.write(records[2], waiter("third"))
        assert told == []  # nothing is told before the batch is written
        await writer.flush
        stored = await storage.steps.get_many("j", ["s0", "s1", "s2"])
        return told, records, stored

    with caplog.at_level(logging.ERROR, logger="choreography_ray.engine"):
        told, records, stored = asyncio.run(scenario())
    assert told == [("first", None), ("second", None), ("third", None)]
    assert [r.state.version for r in records] == [1, 1, 1] and len(stored) == 3
    assert "a step write's waiter failed" in caplog.text


def test_a_change_to_a_record_known_stale_is_refused_at_once():
    async def scenario():
        storage = open_storage("memory://writer-stale").for_key(JobKey())
        writer = _writer(storage)
        record = Tracked(JobStepState(id="s", job_id="j", type="t"), stale=True)
        told: list[BaseException | None] = []
        writer.write(record, told.append)
        return told, writer.flush

    told, flush = asyncio.run(scenario())
    assert len(told) == 1 and isinstance(told[0], StaleRecord)
    assert flush is None  # nothing was scheduled to write
