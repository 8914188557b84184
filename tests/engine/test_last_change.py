"""A job's last change: the writes that change its status or progress stamp it, a write that
only renews the owner's lease does not (what listings filter and sort "last change" by)."""

from __future__ import annotations

from dataclasses import replace

from choreography_ray.jobs import JobsOptions
from choreography_ray.jobs.state import JobOwner
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, request


def test_a_progress_write_stamps_the_last_change_and_a_lease_renewal_does_not(run, script):
    async def scenario() -> None:
        async with InProcessCluster(options=JobsOptions(max_parallel_steps=4)) as cluster:
            manager = cluster.manager()
            manager.ctx = replace(manager.ctx, owner=JobOwner(host="here", activation_epoch=1))
            script.behaviour["a"].block = True
            script.behaviour["b"].block = True
            result = await cluster.start(ScenarioJob, request("a", "b"))
            await cluster.settle()
            jobs = cluster.storage().jobs
            running = await jobs.get(result.job_id)
            assert running.last_change == running.status_changes[-1].occurred

            lease = manager.ctx.options.job_ownership_lease.total_seconds()
            await cluster.advance(lease / 2)  # past a third of the lease: it is renewed
            renewed = await jobs.get(result.job_id)
            assert renewed.version > running.version
            assert renewed.last_change == running.last_change

            await cluster.advance(5)
            script.release("a")
            await cluster.settle()
            progressed = await jobs.get(result.job_id)
            assert progressed.progress.successful_steps == 1
            assert progressed.changed == progressed.last_change == cluster.clock.now()
            assert progressed.last_change > running.last_change
            script.release("b")
            await cluster.settle()

    run(scenario())
