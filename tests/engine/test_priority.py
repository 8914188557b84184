"""Priorities with aging: the worker's run queue prefers the job of the highest effective
priority, a waiting job's priority rises with its wait, and a job without priority pays no
clock reading; end to end in process, with the fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from choreography_ray.engine.run_queue import RunQueue
from choreography_ray.jobs import InvalidOptionError, JobKey, JobsOptions, JobStatus
from choreography_ray.jobs.errors import JobNotFoundError
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, request

KEY = JobKey()
HIGH, LOW = (KEY, "high"), (KEY, "low")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def runs(job: tuple[JobKey, str], count: int) -> list[Any]:
    return [f"{job[1]}-{n}" for n in range(count)]


def drain(queue: RunQueue, clock: Clock | None = None, every: float = 0.0) -> list[str]:
    taken = []
    while (run := queue.pop()) is not None:
        taken.append(run)
        if clock is not None:
            clock.now += every
    return [str(run) for run in taken]


def test_the_job_of_the_higher_priority_runs_first():
    queue = RunQueue(Clock(), aging=1.0)
    queue.extend(LOW, runs(LOW, 3))
    queue.extend(HIGH, runs(HIGH, 3), points=10)
    assert drain(queue) == ["high-0", "high-1", "high-2", "low-0", "low-1", "low-2"]


def test_jobs_of_one_priority_take_turns():
    queue = RunQueue(Clock(), aging=1.0)
    queue.extend(LOW, runs(LOW, 2), points=5)
    queue.extend(HIGH, runs(HIGH, 2), points=5)
    assert drain(queue) == ["low-0", "high-0", "low-1", "high-1"]


@pytest.mark.parametrize(("aging", "position"), [(30.0, 11), (0.0, 100)])
def test_a_waiting_job_gains_priority_at_the_documented_rate(aging, position):
    """30 points a minute, a slot every 2 s: the low job gains a point per slot and overtakes
    a job 10 points above it (which waited one slot) once level, after 11 slots: within 10 / aging
    minutes of waiting plus two slots. Without aging it waits for all 100."""
    clock = Clock()
    queue = RunQueue(clock, aging=aging)
    queue.extend(HIGH, runs(HIGH, 100), points=10)
    queue.extend(LOW, runs(LOW, 1))
    order = drain(queue, clock, every=2.0)
    assert order.index("low-0") == position
    if aging:
        assert order.index("low-0") * 2.0 <= 10 / aging * 60 + 2 * 2.0


def test_a_queue_without_priorities_reads_no_clock():
    clock = Clock()
    queue = RunQueue(clock, aging=1.0)
    queue.extend(LOW, runs(LOW, 3))
    queue.extend(HIGH, runs(HIGH, 3))
    assert drain(queue) == ["low-0", "high-0", "low-1", "high-1", "low-2", "high-2"]
    assert clock.reads == 0


def test_a_priority_changed_reorders_the_queued_runs_and_back_to_zero_takes_turns_again():
    clock = Clock()
    queue = RunQueue(clock, aging=1.0)
    queue.extend(LOW, runs(LOW, 4))
    queue.extend(HIGH, runs(HIGH, 4))
    queue.prioritize(HIGH, 3)
    assert [queue.pop(), queue.pop()] == ["high-0", "high-1"]
    queue.prioritize(HIGH, 0)
    reads = clock.reads
    assert drain(queue) == ["low-0", "high-2", "low-1", "high-3", "low-2", "low-3"]
    assert clock.reads == reads  # back in turn: no clock again


# -- end to end, in process ---------------------------------------------------------------------


@pytest.fixture
def one_slot(script: Any, run: Any) -> Any:
    cluster = InProcessCluster(options=JobsOptions(max_parallel_steps=1), max_parallel_steps=1)
    run(cluster.provider.initialize())
    yield cluster
    run(cluster.close())


def _keys(script: Any) -> list[str]:
    return [key for key, _ in script.runs]


def _blocked_low_job(cluster: Any, script: Any, **kwargs: Any) -> Any:
    """A low job whose first step holds the one slot, its others queued behind it."""
    script.behaviour["l0"].block = True
    return cluster.start(ScenarioJob, request("l0", "l1", "l2", "l3"), **kwargs)


def test_a_higher_priority_job_started_later_runs_before_a_waiting_one(run, one_slot, script):
    async def scenario():
        low = await _blocked_low_job(one_slot, script)
        await one_slot.settle()
        high = await one_slot.start(ScenarioJob, request("h0", "h1", "h2"), priority=5)
        await one_slot.settle()
        script.release("l0")
        await one_slot.settle()
        return (
            await one_slot.manager().get(low.job_id),
            await one_slot.manager().get(high.job_id),
        )

    low, high = run(scenario())
    assert _keys(script) == ["l0", "h0", "h1", "h2", "l1", "l2", "l3"]
    assert (low.priority, high.priority) == (0, 5)
    assert low.status == high.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_without_priorities_the_jobs_take_turns(run, one_slot, script):
    async def scenario():
        await _blocked_low_job(one_slot, script)
        await one_slot.settle()
        await one_slot.start(ScenarioJob, request("h0", "h1", "h2"))
        await one_slot.settle()
        script.release("l0")
        await one_slot.settle()

    run(scenario())
    assert _keys(script) == ["l0", "l1", "h0", "l2", "h1", "l3", "h2"]


def test_a_running_jobs_priority_changes_and_its_queued_steps_go_first(run, one_slot, script):
    async def scenario():
        low = await _blocked_low_job(one_slot, script)
        await one_slot.settle()
        await one_slot.start(ScenarioJob, request("h0", "h1", "h2"), priority=5)
        await one_slot.settle()
        await one_slot.set_priority(low.job_id, 9)
        stored = await one_slot.storage().jobs.find(low.job_id)
        script.release("l0")
        await one_slot.settle()
        return stored

    stored = run(scenario())
    assert stored.priority == 9
    assert _keys(script) == ["l0", "l1", "l2", "l3", "h0", "h1", "h2"]


def test_a_job_class_sets_the_default_priority_and_start_overrides_it(run, cluster, script):
    class Urgent(ScenarioJob, name="scenario.urgent-job"):
        priority = 3

    async def scenario():
        default = await cluster.start(Urgent, request("a"))
        given = await cluster.start(Urgent, request("b"), priority=-2)
        return (
            (await cluster.wait(default.job_id)).priority,
            (await cluster.wait(given.job_id)).priority,
        )

    assert run(scenario()) == (3, -2)


@pytest.mark.parametrize("wrong", [True, 1.5, "5", 10**9])
def test_a_priority_that_is_not_a_whole_number_in_range_is_refused(run, cluster, script, wrong):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        with pytest.raises(InvalidOptionError, match="priority"):
            await cluster.start(ScenarioJob, request("a"), priority=wrong)
        with pytest.raises(InvalidOptionError, match="priority"):
            await cluster.set_priority(result.job_id, wrong)

    run(scenario())


def test_set_priority_of_an_unknown_job_says_so(run, cluster, script):
    with pytest.raises(JobNotFoundError):
        run(cluster.set_priority("no-such-job", 3))


@pytest.mark.parametrize(("finish", "order"), [(10.0, "aaaa" + "bbb"), (0.0, "abababa")])
def test_finish_started_jobs_prefers_the_job_further_along(run, script, finish, order):
    """Job a has done its first stage (5 of 10 steps) when job b starts; its second stage
    waits behind a blocked step. With `finish_started_jobs` its steps go first."""
    options = JobsOptions(max_parallel_steps=1, finish_started_jobs=finish)
    cluster = InProcessCluster(options=options, max_parallel_steps=1)
    first = [f"a{n}" for n in range(5)]
    second = [f"a{n}" for n in range(5, 10)]
    script.behaviour["a5"].block = True

    async def scenario():
        async with cluster:
            stages = {key: 1 for key in second}
            await cluster.start(ScenarioJob, request(*first, *second, stages=stages))
            await cluster.settle()
            await cluster.start(ScenarioJob, request("b0", "b1", "b2"))
            await cluster.settle()
            script.release("a5")
            await cluster.settle()

    run(scenario())
    after = _keys(script)[_keys(script).index("a5") + 1 :]
    assert "".join(key[0] for key in after) == order


@pytest.mark.parametrize(("finish", "order"), [(10.0, "aaaaaabbbb"), (0.0, "aababababa")])
def test_a_job_further_along_is_told_to_its_workers_as_its_steps_finish(run, script, finish, order):
    """Both jobs' steps are queued from the start, at 0 points; each step finishes when the
    test releases it. As job a's outcomes are counted its points grow, and its worker hears
    of it (`tell_progress`): its queued steps go ahead of job b's."""
    options = JobsOptions(max_parallel_steps=1, finish_started_jobs=finish)
    cluster = InProcessCluster(options=options, max_parallel_steps=1)
    keys = [f"a{n}" for n in range(6)] + ["b0", "b1", "b2", "b3"]
    for key in keys:
        script.behaviour[key].block = True

    async def scenario():
        async with cluster:
            await cluster.start(ScenarioJob, request(*keys[:6]))
            await cluster.settle()
            await cluster.start(ScenarioJob, request(*keys[6:]))
            await cluster.settle()
            for _ in keys:
                script.release(script.runs[-1][0])  # the step running now finishes
                await cluster.settle()

    run(scenario())
    assert "".join(key[0] for key in _keys(script)) == order


def test_a_controller_recovers_the_jobs_of_the_highest_effective_priority_first(run, script):
    """Rehydration activates interrupted jobs by effective priority, aged since each was
    created (1 point a minute by default), then the oldest: neither by age alone nor by
    priority alone."""
    cluster = InProcessCluster(options=JobsOptions(max_concurrent_rehydration=1))
    script.behaviour["x"].block = True

    async def scenario():
        async with cluster:
            started = {}
            for name, priority, minutes in (("zero", 0, 2), ("two", 2, 1), ("nine", 9, 1)):
                job = await cluster.start(ScenarioJob, request("x"), priority=priority)
                started[job.job_id] = name
                await cluster.advance(minutes * 60)
            await cluster.crash()
            drained = await cluster.manager().rehydrate()
            script.release("x")
            report = await drained
            return [started[job_id] for job_id in report.queued]

    # effective 4 minutes after the first start: zero 0 + 4, two 2 + 2 (as old), nine 9 + 1
    assert run(scenario()) == ["nine", "zero", "two"]
