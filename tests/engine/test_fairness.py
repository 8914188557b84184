"""Fairness between jobs on one worker: slots go round-robin to the jobs with queued steps, so
a small job is never starved by a large one (issue 9)."""

from __future__ import annotations

from typing import Any

import pytest

from choreography_ray.engine.run_queue import RunQueue
from choreography_ray.jobs import JobKey, JobsOptions, JobStatus

from .fixtures import ScenarioJob, request

A = (JobKey(), "a")
B = (JobKey(), "b")
C = (JobKey(), "c")


def runs(job: tuple[JobKey, str], count: int) -> list[Any]:
    """Stand-ins for runs: the queue only keeps and hands back what it is given."""
    return [f"{job[1]}{n}" for n in range(count)]


def drain(queue: RunQueue) -> list[Any]:
    taken = []
    while (run := queue.pop()) is not None:
        taken.append(run)
    return taken


def test_slots_go_round_robin_to_the_jobs_with_queued_runs():
    queue = RunQueue()
    queue.extend(A, runs(A, 4))
    queue.extend(B, runs(B, 2))
    queue.extend(C, runs(C, 1))
    assert len(queue) == 7
    assert drain(queue) == ["a0", "b0", "c0", "a1", "b1", "a2", "a3"]
    assert len(queue) == 0


def test_a_job_that_joins_takes_its_turn_after_the_jobs_already_queued():
    queue = RunQueue()
    queue.extend(A, runs(A, 3))
    first = queue.pop()
    queue.extend(B, ["b0"])
    queue.extend(A, ["a3"])  # more of a queued job: behind its own runs, no new turn
    assert [first, *drain(queue)] == ["a0", "a1", "b0", "a2", "a3"]


def test_a_job_whose_runs_are_all_taken_leaves_the_ring_and_rejoins_at_the_back():
    queue = RunQueue()
    queue.extend(A, ["a0"])
    queue.extend(B, ["b0", "b1"])
    assert queue.pop() == "a0"  # A has nothing more: it leaves
    queue.extend(A, ["a1"])
    assert drain(queue) == ["b0", "a1", "b1"]


def test_removing_stopped_runs_takes_only_those_still_queued_and_keeps_the_order():
    queue = RunQueue()
    a, b = runs(A, 5), runs(B, 1)
    queue.extend(A, a)
    queue.extend(B, b)
    assert queue.remove(A, [a[1], a[3], *b]) == [a[1], a[3]]  # removed by identity, per job
    assert len(queue) == 4
    assert queue.remove(B, b) == b  # B emptied: it leaves the ring
    assert queue.remove(C, runs(C, 1)) == []
    assert drain(queue) == [a[0], a[2], a[4]]


@pytest.mark.parametrize("options", [JobsOptions(max_parallel_steps=1)])
def test_a_small_job_dispatched_behind_a_large_one_gets_every_other_slot(run, cluster, script):
    large = [f"large-{n}" for n in range(1500)]
    small = [f"small-{n}" for n in range(5)]

    async def scenario():
        script.behaviour["hog"].block = True
        hog = await cluster.start(ScenarioJob, request("hog"))  # holds the only slot
        await cluster.settle()
        first = await cluster.start(ScenarioJob, request(*large))
        await cluster.settle()
        second = await cluster.start(ScenarioJob, request(*small))
        await cluster.settle()
        queued = len(script.runs)
        script.release("hog")
        states = [await cluster.wait(job.job_id) for job in (hog, first, second)]
        return queued, states

    queued, states = run(scenario())
    assert queued == 1  # only the hog ran: both jobs' steps were queued behind it
    assert [state.status for state in states] == [JobStatus.COMPLETED_SUCCESSFULLY] * 3
    order = [key for key, _ in script.runs[1:]]
    assert sorted(order) == sorted(large + small)
    # Round-robin: the small job's 5 steps alternate with the large job's; in FIFO order they
    # would run after all 1,500 of the large job.
    assert max(order.index(key) for key in small) < 10
