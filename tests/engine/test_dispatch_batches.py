"""A large dispatch sends each batch of starts as soon as it is taken from the ledger, so the
worker hosts start on the first batch while the controller takes the rest."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import choreography_ray.engine.stages as stages
from choreography_ray.engine.dispatch_batches import send_in_batches
from choreography_ray.engine.ledger import StepLedger
from choreography_ray.engine.messages import StepStart
from choreography_ray.jobs import JobStatus
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, request


def test_a_job_sends_its_first_batch_before_it_takes_the_next(run, script, monkeypatch):
    events: list[tuple[str, int]] = []
    taking = StepLedger.start

    def start(self: StepLedger, room: int, *args: Any, **kwargs: Any) -> Any:
        chosen, sticky = taking(self, room, *args, **kwargs)
        if chosen:
            events.append(("take", len(chosen)))
        return chosen, sticky

    monkeypatch.setattr(StepLedger, "start", start)
    monkeypatch.setattr(stages, "DISPATCH_BATCH", 4)
    cluster = InProcessCluster()
    sending = cluster.start_steps

    async def start_steps(*args: Any, **kwargs: Any) -> Any:
        events.append(("send", len(args[3])))
        return await sending(*args, **kwargs)

    monkeypatch.setattr(cluster, "start_steps", start_steps)

    async def scenario():
        await cluster.provider.initialize()
        started = await cluster.start(ScenarioJob, request(*(f"k{n}" for n in range(10))))
        return await cluster.wait(started.job_id)

    try:
        state = run(scenario())
    finally:
        run(cluster.close())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 10
    assert sorted(k for k, _ in script.runs) == sorted(f"k{n}" for n in range(10))
    # Taken and sent in turn: the first batch was on its way before the second was taken.
    assert events == [("take", 4), ("send", 4), ("take", 4), ("send", 4), ("take", 2), ("send", 2)]


def _starts(count: int) -> list[StepStart]:
    return [StepStart(f"s{n}", 1) for n in range(count)]


def test_the_batches_are_taken_up_to_the_room_and_answered_in_order(run):
    waiting = _starts(11)
    sent: list[list[str]] = []

    def take(size: int) -> tuple[list[StepStart], dict[str, str]]:
        batch = waiting[:size]
        del waiting[:size]
        return batch, {batch[0].step_id: "host-a"} if batch else {}

    async def send(batch: list[StepStart], hosts: dict[str, str]) -> str:
        sent.append([start.step_id for start in batch])
        await asyncio.sleep(0.001 * (5 - len(sent)))  # later batches answer first
        return f"{batch[0].step_id}@{hosts[batch[0].step_id]}"

    async def scenario():
        batches, sends = await send_in_batches(take, 10, 4, send)
        return batches, await asyncio.gather(*sends)

    batches, answers = run(scenario())
    assert [len(batch) for batch in batches] == [4, 4, 2]  # the room, not every waiting start
    assert [[s.step_id for s in batch] for batch in batches] == sent
    assert answers == ["s0@host-a", "s4@host-a", "s8@host-a"]
    assert [s.step_id for s in waiting] == ["s10"]


def test_taking_stops_when_nothing_is_left_to_take(run):
    waiting = _starts(5)

    def take(size: int) -> tuple[list[StepStart], dict[str, str]]:
        batch = waiting[:size]
        del waiting[:size]
        return batch, {}

    async def send(batch: list[StepStart], hosts: dict[str, str]) -> int:
        return len(batch)

    async def scenario():
        _, sends = await send_in_batches(take, 100, 4, send)
        return await asyncio.gather(*sends)

    assert run(scenario()) == [4, 1]


def test_cancelled_while_taking_it_cancels_the_sends_it_began(run):
    waiting = _starts(12)
    cancelled: list[str] = []

    def take(size: int) -> tuple[list[StepStart], dict[str, str]]:
        batch = waiting[:size]
        del waiting[:size]
        return batch, {}

    async def send(batch: list[StepStart], hosts: dict[str, str]) -> None:
        try:
            await asyncio.Event().wait()  # a worker that has not answered yet
        except asyncio.CancelledError:
            cancelled.append(batch[0].step_id)
            raise

    async def scenario():
        taking = asyncio.ensure_future(send_in_batches(take, 12, 4, send))
        await asyncio.sleep(0)  # the first batch is taken and its send begins
        await asyncio.sleep(0)
        taking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taking
        await asyncio.sleep(0)  # the cancelled sends see their cancellation

    run(scenario())
    began = (12 - len(waiting)) // 4
    assert began >= 1
    assert cancelled == [f"s{4 * n}" for n in range(began)]  # every send it began
