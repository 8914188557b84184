"""A map's results read back on the in-process engine: in item order a page at a time, as
they are stored, or as one list; typed by the step function's result type; failures in place."""

from __future__ import annotations

import asyncio
import sqlite3
import tracemalloc
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import choreography_ray as cr
from choreography_ray.engine import results as reading
from choreography_ray.engine.results import ItemPage, ResultSource, StoredItem
from choreography_ray.jobs import (
    ItemFailed,
    JobNotFoundError,
    JobStatus,
    JobStepStatus,
    ResultsTooLargeError,
)
from choreography_ray.jobs.registry import Payload
from choreography_ray.jobs.state import JobProgress, JobStageProgress, JobState
from choreography_ray.storage.step_query import StepOrder, StepQuery
from choreography_ray.testing import InProcessCluster

GATE: dict[str, asyncio.Event] = {}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    GATE.clear()


class Thumb(BaseModel):
    url: str
    width: int


@cr.step(name="tests.results.thumb")
async def thumb(width: int) -> Thumb:
    if width < 0:
        raise ValueError(f"no image is {width} wide")
    return Thumb(url=f"t/{width}", width=width // 4)


@cr.step(name="tests.results.pair")
async def pair(value: int) -> tuple[int, str]:
    return value, str(value)


@cr.step(name="tests.results.gated")
async def gated(value: int) -> int:
    if value == 2:
        await GATE.setdefault("open", asyncio.Event()).wait()
    return value


async def _all(items: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in items]


def test_results_come_in_item_order_typed_by_the_declared_result_type(run, cluster):
    async def scenario():
        started = await cluster.map(thumb, [400, -1, 800])
        return await _all(cluster.results(started.job_id))

    (first, failed, last) = run(scenario())
    assert first == (0, Thumb(url="t/400", width=100))
    assert type(first.value) is Thumb and not first.failed
    assert last.index == 2 and last.value == Thumb(url="t/800", width=200)
    assert failed.index == 1 and failed.failed
    error = failed.value
    assert isinstance(error, ItemFailed)
    assert (error.index, error.status, error.error_type) == (
        1,
        "COMPLETED_WITH_FAILURE",
        "ValueError",
    )
    assert error.messages == ["ValueError: no image is -1 wide"]
    assert (
        str(error)
        == "item 1 has no result (COMPLETED_WITH_FAILURE): ValueError: no image is -1 wide"
    )


def test_a_plain_result_type_is_typed_back_not_left_as_json(run, cluster):
    async def scenario():
        started = await cluster.map(pair, [3, 4])
        return await cluster.gather(started.job_id)

    assert run(scenario()) == [(3, "3"), (4, "4")]  # a tuple, though JSON keeps a list


def test_a_staged_map_still_reads_in_item_order(run, cluster, monkeypatch):
    monkeypatch.setattr(reading, "PAGE", 2)  # pages of two: each stage read in three pages

    async def scenario():
        started = await cluster.map(pair, [5, 1, 4, 0, 7], stages=lambda item: item % 2)
        state = await cluster.wait(started.job_id)
        return state, await _all(cluster.results(started.job_id))

    state, results = run(scenario())
    assert [s.total_steps for s in state.progress.stages] == [2, 3]  # the plan is by stage
    assert [(index, value[0]) for index, value in results] == list(enumerate([5, 1, 4, 0, 7]))


def test_results_wait_for_an_item_still_running_and_as_completed_does_not(
    run, cluster, monkeypatch
):
    monkeypatch.setattr(reading, "PAGE", 2)

    async def scenario():
        started = await cluster.map(gated, range(5))
        await cluster.settle()
        in_order = cluster.results(started.job_id)
        completed = cluster.as_completed(started.job_id)
        before = [await anext(in_order), await anext(in_order)]
        third = asyncio.ensure_future(anext(in_order))
        done = [await anext(completed) for _ in range(4)]
        waited = third.done()
        GATE["open"].set()
        return before, waited, await third, done, await _all(completed), await _all(in_order)

    before, waited, third, done, rest, tail = run(scenario())
    assert before == [(0, 0), (1, 1)]
    assert not waited and third == (2, 2)  # item 2 was waited for, in order
    assert sorted(done) == [(0, 0), (1, 1), (3, 3), (4, 4)]  # item 2 was still running
    assert rest == [(2, 2)]
    assert tail == [(3, 3), (4, 4)]


def test_a_failed_attempt_that_will_be_retried_is_not_an_outcome(run, cluster):
    @cr.step(name="tests.results.flaky", max_attempts=2)
    async def flaky(value: int, ctx: cr.StepContext) -> str:
        if value % 2 and ctx.attempt == 1:
            raise ConnectionError("try again")
        return f"{value} on attempt {ctx.attempt}"

    async def scenario():
        started = await cluster.map(flaky, range(3))
        await cluster.settle()  # items 0 and 2 succeeded; item 1 failed and waits to retry
        completed = cluster.as_completed(started.job_id)
        in_order = cluster.results(started.job_id)
        done = [await anext(completed), await anext(completed)]
        first = await anext(in_order)
        second = asyncio.ensure_future(anext(in_order))
        last = asyncio.ensure_future(anext(completed))
        await cluster.settle()
        early = second.done() or last.done()
        await cluster.advance(1)  # the retry policy's first backoff
        return done, first, early, await second, await last

    done, first, early, second, last = run(scenario())
    assert sorted(done) == [(0, "0 on attempt 1"), (2, "2 on attempt 1")]
    assert first == (0, "0 on attempt 1")
    assert not early
    assert second == last == (1, "1 on attempt 2")


def test_a_stopped_maps_items_never_run_carry_why(run, cluster):
    async def scenario():
        started = await cluster.map(gated, range(4))
        await cluster.settle()
        await cluster.manager().stop(started.job_id)
        await cluster.wait(started.job_id)
        completed = await _all(cluster.as_completed(started.job_id))
        return completed, await cluster.gather(started.job_id, return_exceptions=True)

    completed, gathered = run(scenario())
    assert [index for index, _ in completed] == [0, 1, 2, 3]  # finished: in item order
    assert gathered[:2] == [0, 1] and gathered[3] == 3
    assert completed[2].failed and completed[2].value.status == "STOPPED"
    stopped = gathered[2]
    assert isinstance(stopped, ItemFailed) and stopped.status == "STOPPED"


def test_gather_raises_the_first_failure_in_item_order_or_returns_it_in_place(run, cluster):
    async def scenario():
        started = await cluster.map(thumb, [4, -2, -3])
        with pytest.raises(ItemFailed, match=r"item 1 has no result .*-2 wide"):
            await cluster.gather(started.job_id)
        return await cluster.gather(started.job_id, return_exceptions=True)

    first, second, third = run(scenario())
    assert first == Thumb(url="t/4", width=1)
    assert [type(second), type(third)] == [ItemFailed, ItemFailed] and third.index == 2


def test_gather_refuses_a_job_above_its_limit_before_reading_a_result(run, cluster, monkeypatch):
    monkeypatch.setattr(reading, "GATHER_LIMIT", 3)

    async def scenario():
        started = await cluster.map(pair, range(4))
        await cluster.wait(started.job_id)
        return started.job_id, await _all(cluster.results(started.job_id))

    job_id, listed = run(scenario())
    assert len(listed) == 4  # iterating reads any size
    with pytest.raises(ResultsTooLargeError, match=r"has 4 items; gather returns at most 3"):
        run(cluster.gather(job_id))


def test_a_removed_or_unknown_job_has_no_results(run, cluster):
    async def scenario():
        started = await cluster.map(gated, range(4))
        await cluster.settle()
        await cluster.manager().remove(started.job_id)
        await cluster.settle()
        return started.job_id

    job_id = run(scenario())
    for job in (job_id, "never-was"):
        with pytest.raises(JobNotFoundError):
            run(_all(cluster.results(job)))


def test_an_unreadable_record_stands_as_a_failed_item_in_its_place(run, tmp_path: Path):
    path = tmp_path / "jobs.db"

    async def scenario():
        async with InProcessCluster(f"sqlite:///{path}") as cluster:
            started = await cluster.map(pair, range(4))
            await cluster.wait(started.job_id)
            with sqlite3.connect(path) as db:
                db.execute(
                    "UPDATE choreography_job_steps SET state = '{not json' WHERE position = 2"
                )
            return await cluster.gather(started.job_id, return_exceptions=True)

    gathered = run(scenario())
    assert gathered[:2] == [(0, "0"), (1, "1")] and gathered[3] == (3, "3")
    assert isinstance(gathered[2], ItemFailed) and "cannot be read" in str(gathered[2])


# -- a page at a time ----------------------------------------------------------------------------


class Pages:
    """Step storage of `total` completed items, made up a page at a time as asked: what the
    reading holds is all that is measured."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.largest = 0
        self.job = JobState(
            id="big",
            type="choreography.map",
            created=datetime.now(UTC),
            status=JobStatus.COMPLETED_SUCCESSFULLY,
            progress=JobProgress(
                total_steps=total,
                successful_steps=total,
                stages=[JobStageProgress(stage=0, is_started=True, total_steps=total)],
            ),
        )

    def source(self) -> ResultSource:
        async def job() -> JobState:
            return self.job

        async def pause() -> None:
            raise AssertionError("a finished job is never waited for")

        return ResultSource(job, self.page, pause)

    async def page(self, query: StepQuery) -> ItemPage:
        assert query.order is StepOrder.PLAN and query.limit is not None
        self.largest = max(self.largest, query.limit)
        first = 0 if query.after is None else query.after.position + 1
        last = min(self.total, first + query.limit)
        items = [
            StoredItem(
                index=i,
                stage=0,
                step_id=f"s{i:09d}",
                step_type=pair.name,
                status=JobStepStatus.COMPLETED_SUCCESSFULLY,
                changed=1,
                settled=True,
                result=Payload(type=f"{pair.name}:result", data=[i, str(i)]),
            )
            for i in range(first, last)
        ]
        following = items[-1].cursor(StepOrder.PLAN) if last < self.total else None
        return ItemPage(items, following)


def test_a_large_maps_results_are_read_a_page_at_a_time_within_a_memory_bound():
    """20,000 results, typed one by one: held at once they take about 18 MB (90 MB for
    100,000); read through the paged query the reading peaks near 0.5 MB, at any size."""
    pages = Pages(20_000)

    async def count() -> int:
        seen = 0
        async for index, value in reading.typed(
            reading.in_item_order(pages.source()), cr.default_registry
        ):
            assert value == (index, str(index))
            seen += 1
        return seen

    tracemalloc.start()
    try:
        seen = asyncio.run(count())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == 20_000
    assert pages.largest == reading.PAGE
    assert peak < 3_000_000, f"reading peaked at {peak / 1e6:.1f} MB"
