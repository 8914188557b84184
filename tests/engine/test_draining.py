"""Ray's node drains, in-process: a worker host whose node drains takes no new start and its
queued runs move to the hosts that stay, ahead of their queues; runs stopped before the node
goes run again elsewhere under the same identity; a controller whose node drains hands its
job to another by compare-and-set, and the new owner carries on without running anything
twice."""

from __future__ import annotations

import pytest

from choreography_ray.jobs import JobKey, JobsOptions, JobStatus, OwnedElsewhereError
from choreography_ray.jobs.state import JobOwner
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, request
from .test_ownership import host

KEYS = [f"k{n}" for n in range(6)]


def _held(cluster: InProcessCluster, name: str, job_id: str) -> list[str]:
    return cluster.workers[name].held(JobKey(), job_id)


def test_queued_runs_move_off_a_draining_worker_and_no_start_goes_there(run, script):
    async def scenario() -> None:
        async with InProcessCluster(workers=2, max_parallel_steps=1) as cluster:
            for key in KEYS:
                script.behaviour[key].block = True
            result = await cluster.start(ScenarioJob, request(*KEYS))
            await cluster.settle()
            assert len(_held(cluster, "worker-1", result.job_id)) == 3  # 1 performs, 2 wait
            moved = await cluster.drain_worker("worker-1")
            await cluster.settle()
            assert moved == 2
            assert len(_held(cluster, "worker-1", result.job_id)) == 1  # the one performing
            queue = cluster.workers["worker-0"]._queue._by_job[(JobKey(), result.job_id)]
            moved_ids = {run.step_id for run in list(queue)[:2]}
            assert len(queue) == 4 and moved_ids <= set(_held(cluster, "worker-0", result.job_id))
            script.release(*KEYS)
            state = await cluster.wait(result.job_id)
            assert state is not None and state.status == JobStatus.COMPLETED_SUCCESSFULLY
            assert sorted(key for key, _ in script.runs) == KEYS  # each performed once
            sent_after = [host for host, _ in cluster.sent[len(KEYS) :]]
            assert "worker-1" not in sent_after  # nothing new went to the draining host

    run(scenario())


def test_runs_stopped_before_the_node_goes_run_again_elsewhere(run, script):
    async def scenario() -> None:
        async with InProcessCluster(workers=2, max_parallel_steps=1) as cluster:
            for key in KEYS[:2]:
                script.behaviour[key].block = True
            result = await cluster.start(ScenarioJob, request(*KEYS[:2]))
            await cluster.settle()
            await cluster.drain_worker("worker-1")
            assert cluster.workers["worker-1"].stop_all() == 1  # the deadline is near
            await cluster.settle()
            assert _held(cluster, "worker-1", result.job_id) == []
            assert len(_held(cluster, "worker-0", result.job_id)) == 2  # sent again, there
            script.release(*KEYS[:2])
            state = await cluster.wait(result.job_id)
            assert state is not None and state.status == JobStatus.COMPLETED_SUCCESSFULLY
            assert state.progress.successful_steps == 2 and state.progress.stopped_steps == 0

    run(scenario())


def test_a_controller_whose_node_drains_hands_its_job_over_and_the_new_owner_goes_on(run, script):
    async def scenario() -> None:
        async with InProcessCluster(options=JobsOptions(max_parallel_steps=4)) as cluster:
            here = host(cluster, "here", {"here", "there"})
            there = host(cluster, "there", {"here", "there"})
            for key in KEYS[:3]:
                script.behaviour[key].block = True
            result = await here.start(ScenarioJob, request(*KEYS[:3]))
            await cluster.settle()
            activation = here.live(result.job_id)
            assert activation is not None
            owner = JobOwner(host="there", activation_epoch=1)
            assert await here.hand_over(result.job_id, owner)
            assert activation.released and here.live(result.job_id) is None
            stored = await cluster.storage().jobs.get(result.job_id)
            assert stored.owner is not None and stored.owner.host == "there"
            with pytest.raises(OwnedElsewhereError):  # a late report is sent to the new owner
                await here.deliver(result.job_id, [])
            await there.adopt(result.job_id)
            await cluster.settle()
            assert there.live(result.job_id) is not None
            script.release(*KEYS[:3])
            await cluster.settle()
            final = await cluster.storage().jobs.get(result.job_id)
            assert final.status == JobStatus.COMPLETED_SUCCESSFULLY
            assert sorted(key for key, _ in script.runs) == KEYS[:3]  # nothing ran twice

    run(scenario())
