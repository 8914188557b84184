"""`map`: a step function over many items as one durable job, on the in-process engine."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
import weakref
from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

import choreography_ray as cr
from choreography_ray.engine import planning
from choreography_ray.jobs import JobStatus, StartJobError, StepDetails, default_registry
from choreography_ray.jobs.mapping import ItemChunk, MapItems, MapJob, MapRequest
from choreography_ray.testing import InProcessCluster

from .test_planning import Recorder

RUNS: Counter[int] = Counter()
"""Runs per item, of the steps below."""
GATE: dict[str, asyncio.Event] = {}
"""Set GATE["open"] to hold `held` steps until it is set."""
ACTIVE: list[int] = [0, 0]
"""Steps of `held` running now, and the most at once."""


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RUNS.clear()
    GATE.clear()
    ACTIVE[:] = [0, 0]


@cr.step(name="tests.map.square")
async def square(value: int) -> int:
    RUNS[value] += 1
    if value < 0:
        raise ValueError(f"negative: {value}")
    return value * value


@cr.step(name="tests.map.cube")
def cube(value: int) -> int:
    """A plain def: it runs off the loop, in a thread here, in a Ray task on a cluster."""
    RUNS[value] += 1
    return value**3


@cr.step(name="tests.map.held")
async def held(value: int, ctx: cr.StepContext) -> int:
    RUNS[value] += 1
    ACTIVE[0] += 1
    ACTIVE[1] = max(ACTIVE)
    try:
        await GATE.setdefault("open", asyncio.Event()).wait()
    finally:
        ACTIVE[0] -= 1
    return value


@cr.step(name="tests.map.flaky", max_attempts=2)
async def flaky(value: int, ctx: cr.StepContext) -> str:
    RUNS[value] += 1
    if value % 2 and ctx.attempt == 1:
        raise ConnectionError("try again")
    return f"{value} on attempt {ctx.attempt}"


class Shape(BaseModel):
    sides: int


@cr.step(name="tests.map.angles")
async def angles(shape: Shape) -> float:
    return 180.0 * (shape.sides - 2)


async def _cluster(**kwargs: Any) -> InProcessCluster:
    cluster = InProcessCluster(**kwargs)
    await cluster.provider.initialize()
    return cluster


async def _results(cluster: InProcessCluster, job_id: str) -> dict[str, Any]:
    """Each item's stored outcome by its step's name: its result, or its error's messages."""
    steps = await cluster.storage().steps.get_for_job(job_id)
    return {
        step.name: step.result.data if step.result is not None else step.error.messages
        for step in steps
        if step.result is not None or step.error is not None
    }


def test_a_map_runs_one_step_per_item_and_keeps_every_result(run, cluster):
    async def scenario():
        started = await cluster.map(square, range(5), name="squares")
        state = await cluster.wait(started.job_id)
        return started, state, await _results(cluster, started.job_id)

    started, state, results = run(scenario())
    assert started.error is None
    assert state is not None  # kept after completing: its results are what it is for
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert (state.type, state.details) == (MapJob.name, "squares")
    assert results == {f"item {i}": i * i for i in range(5)}
    assert Counter(range(5)) == RUNS


def test_failed_items_carry_their_error_and_the_others_their_result(run, cluster):
    async def scenario():
        started = await cluster.map(square, [2, -1, 3])
        state = await cluster.wait(started.job_id)
        return state, await _results(cluster, started.job_id)

    state, results = run(scenario())
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert results == {"item 0": 4, "item 1": ["ValueError: negative: -1"], "item 2": 9}


def test_model_items_and_plain_def_steps(run, cluster):
    async def scenario():
        models = await cluster.map(angles, [Shape(sides=3), {"sides": 4}])
        plain = await cluster.map(cube, [2, 3])
        return (
            await _results(cluster, (await cluster.wait(models.job_id)).id),
            await _results(cluster, (await cluster.wait(plain.job_id)).id),
        )

    models, plain = run(scenario())
    assert models == {"item 0": 180.0, "item 1": 360.0}
    assert plain == {"item 0": 8, "item 1": 27}


def test_the_plan_of_every_item_is_saved_before_any_step_is_prepared(run):
    recorder = Recorder()

    async def scenario():
        cluster = await _cluster(wrap_storage=recorder.wrap)
        try:
            started = await cluster.map(square, range(3))
            await cluster.wait(started.job_id)
        finally:
            await cluster.close()

    run(scenario())
    first_steps = next(i for i, (kind, _) in enumerate(recorder.events) if kind == "steps")
    planned = [
        state
        for kind, state in recorder.events[:first_steps]
        if kind == "job" and state.status == JobStatus.PREPARING_STEPS
    ]
    assert len(planned) == 1
    assert [step.name for step in planned[0].plan] == ["item 0", "item 1", "item 2"]
    assert [step.request.data for step in planned[0].plan] == [0, 1, 2]
    assert planned[0].request.data == {"step": "tests.map.square", "items": 3, "name": ""}


@pytest.mark.parametrize(
    ("items", "reason"),
    [
        ([1, float("nan")], "item 1 cannot be planned: .*nan"),
        ([1, 2, "three"], "item 2 cannot be planned: step 'tests.map.square' takes int items"),
        ([1.5], "item 0 cannot be planned: .*fractional part"),
    ],
)
def test_items_that_do_not_round_trip_are_refused_before_anything_is_stored(
    run, cluster, items, reason
):
    async def scenario():
        with pytest.raises(cr.StartJobFailed, match=reason) as refused:
            await cluster.map(square, items)
        return refused.value, await cluster.storage().jobs.query()

    refused, stored = run(scenario())
    assert refused.code == StartJobError.INVALID_STEP_PLAN
    assert stored == []


def test_items_the_host_cannot_read_fail_the_job_as_an_invalid_plan(run, cluster):
    """The host checks what it is sent again: a start from a client of another release, or
    one that bypassed the client, cannot plan items the step does not take."""
    mapped = MapItems(step=square.name, count=2, chunks=[ItemChunk(first=0, items=b'[1, "two"]')])

    async def scenario():
        started = await cluster.manager().start(
            MapJob,
            MapRequest(step=square.name, items=2),
            steps=mapped.details(default_registry),
        )
        return started, await cluster.wait(started.job_id)

    started, state = run(scenario())
    assert started.error == StartJobError.INVALID_STEP_PLAN
    assert "do not fit step 'tests.map.square'" in started.reason
    assert state.status == JobStatus.FAILED and not RUNS


def test_a_map_job_cannot_be_started_without_its_items(run, cluster):
    async def scenario():
        return await cluster.start(MapJob, MapRequest(step=square.name, items=1))

    started = run(scenario())
    assert started.error == StartJobError.UNKNOWN
    assert "use jobs.map(fn, items)" in started.reason


def test_only_step_functions_map_and_items_must_be_an_iterable(run, cluster):
    def plain(value: int) -> int:
        return value

    async def scenario():
        with pytest.raises(TypeError, match=r"decorate it with @cr\.step"):
            await cluster.map(plain, [1])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="an iterable of items, got a str"):
            await cluster.map(square, "123")
        with pytest.raises(ValueError, match="max_active_steps must be a whole number >= 1"):
            await cluster.map(square, [1], max_active_steps=0)
        with pytest.raises(cr.StartJobFailed, match="item 1: its stage must be"):
            await cluster.map(square, [0, 2], stages=lambda item: -item)

    run(scenario())


def test_mapping_again_under_the_same_job_id_returns_that_job(run, cluster):
    async def scenario():
        first = await cluster.map(square, range(3), job_id="squares:1")
        await cluster.wait(first.job_id)
        again = await cluster.map(square, range(3), job_id="squares:1")
        steps = await cluster.storage().steps.get_for_job("squares:1")
        return first, again, steps

    first, again, steps = run(scenario())
    assert (first.job_id, again.job_id) == ("squares:1", "squares:1")
    assert again.error == StartJobError.ALREADY_COMPLETED
    assert len(steps) == 3 and Counter(range(3)) == RUNS


def test_failed_attempts_are_retried_up_to_the_step_functions_max_attempts(run, cluster):
    async def scenario():
        started = await cluster.map(flaky, range(4))
        await cluster.advance(1)  # the retry policy's first backoff
        state = await cluster.wait(started.job_id)
        return state, await _results(cluster, started.job_id)

    state, results = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert results == {
        "item 0": "0 on attempt 1",
        "item 1": "1 on attempt 2",
        "item 2": "2 on attempt 1",
        "item 3": "3 on attempt 2",
    }


def test_stages_run_their_items_after_the_stage_before(run, cluster):
    order: list[int] = []

    @cr.step(name="tests.map.ordered")
    async def ordered(value: int) -> int:
        order.append(value)
        return value

    async def scenario():
        started = await cluster.map(ordered, [5, 1, 4, 0], stages=lambda item: item % 2)
        return await cluster.wait(started.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert sorted(order[:2]) == [0, 4] and sorted(order[2:]) == [1, 5]
    assert [s.total_steps for s in state.progress.stages] == [2, 2]


def test_a_maps_window_bounds_its_active_steps_and_is_kept_across_a_crash(run, cluster):
    async def scenario():
        started = await cluster.map(held, range(10), max_active_steps=3)
        await cluster.settle()
        before = ACTIVE[1]
        await cluster.crash()
        ACTIVE[:] = [0, 0]
        await (await cluster.manager().rehydrate())
        await cluster.settle()
        after = ACTIVE[1]
        GATE["open"].set()
        state = await cluster.wait(started.job_id)
        return before, after, state

    before, after, state = run(scenario())
    assert (before, after) == (3, 3)
    assert state.max_active_steps == 3
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_stop_and_resume_a_map_completed_items_are_not_run_again(run, cluster):
    @cr.step(name="tests.map.half-held")
    async def half_held(value: int) -> int:
        RUNS[value] += 1
        if value >= 2:
            await GATE.setdefault("open", asyncio.Event()).wait()
        return value

    async def scenario():
        started = await cluster.map(half_held, range(4))
        await cluster.settle()
        await cluster.manager().stop(started.job_id)
        stopped = await cluster.wait(started.job_id)
        GATE["open"].set()
        await cluster.manager().resume(started.job_id)
        return stopped, await cluster.wait(started.job_id), await _results(cluster, started.job_id)

    stopped, resumed, results = run(scenario())
    assert stopped.status == JobStatus.STOPPED
    assert (stopped.progress.successful_steps, stopped.progress.stopped_steps) == (2, 2)
    assert resumed.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert Counter({0: 1, 1: 1, 2: 2, 3: 2}) == RUNS
    assert results == {f"item {i}": i for i in range(4)}


def test_a_crashed_map_is_recovered_from_storage_by_the_step_functions_name(run, cluster):
    async def scenario():
        started = await cluster.map(held, range(3))
        await cluster.settle()
        await cluster.crash()
        GATE["open"].set()
        await (await cluster.manager().rehydrate())
        state = await cluster.wait(started.job_id)
        return state, await _results(cluster, started.job_id)

    state, results = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert results == {"item 0": 0, "item 1": 1, "item 2": 2}


def test_a_generator_of_a_million_items_is_planned_without_holding_its_items(run):
    """The items are drawn a chunk at a time and kept as JSON only: planning a million of
    them peaks at their JSON and a chunk's work, never at the million items as a list."""

    def items():
        yield from range(1_000_000)

    gc.collect()
    tracemalloc.start()
    try:
        mapped = MapItems.of(square, items(), default_registry)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert mapped.count == 1_000_000
    json_size = sum(len(chunk.items) for chunk in mapped.chunks)
    assert kept < json_size + 1_000_000
    # A list of a million ints alone is 36 MB; a chunk's work is about 1 MB.
    assert peak - kept < 4_000_000, f"planning peaked {peak - kept:,} bytes above its JSON"


def test_the_host_plans_a_chunk_of_items_at_a_time(run):
    """The host expands one chunk of items into steps at a time, letting each chunk go."""
    mapped = MapItems.of(square, range(25_000), default_registry)
    details = mapped.details(default_registry)
    assert len(mapped.chunks) == 3
    next(details)
    assert len(mapped.chunks) == 2  # the first chunk taken, the others still JSON
    assert sum(1 for _ in details) == 24_999
    assert mapped.chunks == []


def test_a_plan_is_built_from_steps_drawn_a_chunk_at_a_time(run, cluster, monkeypatch):
    """The engine draws the steps it is given a chunk at a time and lets each chunk's go
    once planned: the steps of a million items never exist at once."""
    monkeypatch.setattr(planning, "PLAN_CHUNK", 100)
    drawn: list[weakref.ref[StepDetails]] = []
    alive_at_250: list[int] = []

    def steps():
        for index, details in enumerate(
            MapItems.of(square, range(300), default_registry).details(default_registry)
        ):
            if index == 250:
                gc.collect()
                alive_at_250.append(sum(ref() is not None for ref in drawn[:100]))
            drawn.append(weakref.ref(details))
            yield details

    async def scenario():
        started = await cluster.manager().start(
            MapJob, MapRequest(step=square.name, items=300), steps=steps()
        )
        return await cluster.wait(started.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert alive_at_250 == [0]


def test_a_result_that_does_not_fit_the_declared_type_fails_the_item_with_why(run, cluster):
    @cr.step(name="tests.map.wrong-result")
    async def wrong(value: int) -> int:
        return "not a number"  # type: ignore[return-value]

    async def scenario():
        started = await cluster.map(wrong, [1])
        return await cluster.wait(started.job_id), await _results(cluster, started.job_id)

    state, results = run(scenario())
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert results["item 0"][0].startswith("the step's result cannot be stored")


class Shapes(BaseModel):
    sides: list[int]


@cr.job(name="tests.map.shapes", keep_after_completed=True)
def shapes(request: Shapes):  # type: ignore[no-untyped-def]
    """Two step functions in one job, the second in a later stage."""
    return [angles.plan(Shape(sides=n), name=f"angles {n}") for n in request.sides] + [
        square.plan(n, stage=1, name=f"square {n}") for n in request.sides
    ]


class ClassJob(cr.Job[Shapes], name="tests.map.class-job"):
    keep_after_completed = True

    def prepare_steps(self, request: Shapes):  # type: ignore[no-untyped-def]
        return [cube.plan(n, name=f"cube {n}") for n in request.sides]


def test_a_job_function_runs_the_steps_of_several_functions_by_stage(run, cluster):
    async def scenario():
        started = await cluster.start(shapes, Shapes(sides=[3, 4]))
        state = await cluster.wait(started.job_id)
        return state, await _results(cluster, started.job_id)

    state, results = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert [s.total_steps for s in state.progress.stages] == [2, 2]
    assert results == {"angles 3": 180.0, "angles 4": 360.0, "square 3": 9, "square 4": 16}


def test_a_step_function_plans_steps_of_a_class_defined_job(run, cluster):
    async def scenario():
        started = await cluster.start(ClassJob, Shapes(sides=[2]))
        return await _results(cluster, (await cluster.wait(started.job_id)).id)

    assert run(scenario()) == {"cube 2": 8}


def test_an_item_a_job_function_plans_that_does_not_fit_is_an_invalid_plan(run, cluster):
    @cr.job(name="tests.map.bad-plan")
    def bad_plan(request: Shapes):  # type: ignore[no-untyped-def]
        return [angles.plan({"corners": 3})]

    async def scenario():
        return await cluster.start(bad_plan, Shapes(sides=[]))

    started = run(scenario())
    assert started.error == StartJobError.INVALID_STEP_PLAN
    assert "takes Shape items" in started.reason
