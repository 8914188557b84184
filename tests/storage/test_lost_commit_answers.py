"""A SQL batch of step records whose commit landed while its answer was lost: the provider
tries the batch again (a transient error), finds the records moved on, and reports a conflict.
The worker's group commit then reads them back, finds its own write, and the run goes on
(tests/engine/test_lost_answers.py has the engine's side)."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest

from choreography_ray.engine.clock import FakeClock
from choreography_ray.engine.writer import StepWriter, Tracked
from choreography_ray.jobs import JobStepState, JobStepStatus
from choreography_ray.jobs.retry import Backoff
from choreography_ray.jobs.state import StatusChange
from choreography_ray.storage import JobsStorage
from choreography_ray.storage.sql.steps import SqlJobStepStorage

from .conftest import STEP_TYPE
from .support import ProviderSupport, supports, usable


@pytest.fixture(
    params=[s for s in supports() if s.name in ("sqlite", "postgres")], ids=lambda s: s.name
)
def support(request: pytest.FixtureRequest) -> ProviderSupport:
    return usable(request.param)


def _answer_lost(support: ProviderSupport) -> BaseException:
    """The transient error a dropped connection raises on this provider."""
    if support.name == "sqlite":
        return sqlite3.OperationalError("database is locked (after the commit)")
    import psycopg

    return psycopg.OperationalError("the server closed the connection after the commit")


def test_a_batch_whose_commit_answer_was_lost_is_the_writers_own(
    support: ProviderSupport, storage: JobsStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = SqlJobStepStorage._write_batch
    raised: list[BaseException] = []

    def commit_then_fail(self: Any, inserts: Any, updates: Any) -> bool:
        written = original(self, inserts, updates)
        if updates and not raised:
            raised.append(_answer_lost(support))
            raise raised[0]
        return written

    monkeypatch.setattr(SqlJobStepStorage, "_write_batch", commit_then_fail)

    async def scenario() -> tuple[list[Any], Tracked, JobStepState]:
        prepared = JobStepState(id="s1", job_id="j1", type=STEP_TYPE, is_prepared=True)
        prepared.version = await storage.steps.save(prepared)
        change = StatusChange(status=int(JobStepStatus.RUNNING), occurred=FakeClock().now())
        running = prepared.model_copy(
            update={"status": JobStepStatus.RUNNING, "status_changes": [change], "generation": 1}
        )
        record = Tracked(running)
        writer = StepWriter(storage.key, storage, clock=FakeClock(), backoff=Backoff(0.01, 0.1))
        told: list[Any] = []
        writer.write(record, told.append)
        await writer.flush
        return told, record, await storage.steps.get("j1", "s1")

    told, record, stored = asyncio.run(scenario())
    assert raised, "the commit's answer was not lost: the test injected nothing"
    assert told == [None], f"the run was told {told[0]!r}"
    assert record.state.version == stored.version == 2
    assert stored.status == JobStepStatus.RUNNING
