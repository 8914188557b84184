"""Worker hosts that join a running cluster get work at once: a job waiting for a worker
dispatches to the first one that joins without waiting for its timer, and a share of the runs
queued (not started) on the busy hosts moves to the new ones, each under its identity. A step
sent again after its host was lost goes to the front of its job's queue on the host that
takes it, not behind the queued runs."""

from __future__ import annotations

from choreography_ray.jobs import JobsOptions, JobStatus
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, request

KEYS = [f"k{n:02d}" for n in range(20)]


def _cluster(**options) -> InProcessCluster:
    return InProcessCluster(options=JobsOptions(**options), max_parallel_steps=2)


def test_queued_runs_move_to_a_worker_that_joins(run, script):
    async def scenario() -> None:
        async with _cluster() as cluster:
            for key in KEYS:
                script.behaviour[key].block = True
            result = await cluster.start(ScenarioJob, request(*KEYS))
            await cluster.settle()
            first = cluster.worker
            assert len(script.runs) == 2  # two slots: eighteen runs queued behind them
            joined = await cluster.join_worker("worker-new")
            await cluster.settle()
            assert len(joined.held(cluster.storage().key, result.job_id)) == 9  # half moved
            assert len(first.held(cluster.storage().key, result.job_id)) == 11
            assert len(script.runs) == 4  # the joined host performs at once
            script.release(*KEYS)
            state = await cluster.wait(result.job_id)
            assert state is not None and state.status == JobStatus.COMPLETED_SUCCESSFULLY
            assert state.progress.successful_steps == len(KEYS)
            assert sorted(key for key, _ in script.runs) == KEYS  # each ran once

    run(scenario())


def test_a_job_waiting_for_a_worker_starts_when_one_joins_not_at_its_timer(run, script):
    async def scenario() -> None:
        async with InProcessCluster(workers=0, options=JobsOptions()) as cluster:
            result = await cluster.start(ScenarioJob, request("a", "b"))
            await cluster.settle()
            waiting = await cluster.storage().jobs.get(result.job_id)
            assert waiting.waiting_for_worker is not None
            assert script.runs == []
            await cluster.join_worker("worker-0")
            await cluster.settle()  # no time passes: the join itself sends the starts
            state = await cluster.storage().jobs.get(result.job_id)
            assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
            assert state.waiting_for_worker is None

    run(scenario())


def test_a_step_sent_again_after_its_host_was_lost_goes_first(run, script):
    async def scenario() -> None:
        async with InProcessCluster(workers=2, max_parallel_steps=1) as cluster:
            for key in KEYS[:6]:
                script.behaviour[key].block = True
            result = await cluster.start(ScenarioJob, request(*KEYS[:6]))
            await cluster.settle()
            key = cluster.storage().key
            lost_steps = set(cluster.workers["worker-1"].held(key, result.job_id))
            await cluster.lose_worker("worker-1")  # its three runs go to worker-0
            await cluster.settle()
            survivor = cluster.workers["worker-0"]
            order = [run.step_id for run in survivor._queue._by_job[(key, result.job_id)]]
            assert set(order[:3]) == lost_steps  # ahead of the runs queued there before

    run(scenario())
