"""Fencing: a host declared dead that still runs cannot overwrite a newer run, and a
controller whose ownership lease ran out stops acting on the job.

A step's record carries a version, and every write is a compare-and-set on it; a run's
Running write bumps it. So the run a job started again elsewhere, once it wrote Running, wins
over the old run: the old run's outcome write finds a newer version and is dropped, and the
stored record names the newer run (its lease: host and activation, with the attempt).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

from pydantic import BaseModel

from choreography_ray.jobs import Job, JobsOptions, JobStatus, JobStep, JobStepStatus, StepContext
from choreography_ray.jobs.state import JobOwner
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, WindowJob, request


class Once(BaseModel):
    n: int = 0


GATES: list[asyncio.Event] = []
"""One per run of `Gated`, in the order the runs began: the test decides which ends first."""


class Gated(JobStep[Once, Once, int], name="fencing-tests.gated"):
    def initialize_state(self, request: Once) -> Once:
        return request

    async def perform(self, state: Once, ctx: StepContext) -> int:
        gate = asyncio.Event()
        GATES.append(gate)
        await gate.wait()
        return len(GATES)


class OneStep(Job[Once], name="fencing-tests.one-step"):
    keep_after_completed = True

    def prepare_steps(self, request: Once):
        return [self.create_step(Gated, request)]


def test_a_run_started_again_elsewhere_wins_over_the_run_of_a_host_declared_dead(run):
    """The newer run stores its outcome first; the old run, finishing later on the host Ray
    declared dead, must not overwrite it, nor be counted a second time."""

    async def scenario() -> None:
        GATES.clear()
        async with InProcessCluster(workers=2, options=JobsOptions(max_parallel_steps=4)) as cl:
            result = await cl.start(OneStep, Once())
            await cl.settle()
            key = cl.storage().key
            (holder,) = [n for n, w in cl.workers.items() if w.held(key, result.job_id)]
            (other,) = [name for name in cl.workers if name != holder]
            dead = await cl.partition_worker(holder)  # its run goes on
            await cl.settle()
            assert [host for host, _ in cl.sent] == [holder, other]
            old, new = GATES
            new.set()  # the newer run stores its outcome
            await cl.settle()
            old.set()  # then the old run ends, on the host declared dead
            await cl.settle()
            (stored,) = await cl.storage().steps.get_for_job(result.job_id)
            assert stored.status == JobStepStatus.COMPLETED_SUCCESSFULLY
            assert stored.lease is not None and stored.lease.host == other
            assert stored.lease.activation == cl.workers[other].activation_id
            assert stored.result is not None and stored.result.data == 2  # the newer run's
            state = await cl.storage().jobs.get(result.job_id)
            assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
            assert state.progress.successful_steps == 1  # counted once
            await dead.close()

    run(scenario())


async def _only_step(cluster: InProcessCluster, job_id: str) -> str:
    (step,) = await cluster.storage().steps.get_for_job(job_id)
    return step.id


def test_the_stored_outcome_names_the_run_that_stored_it(run, script):
    async def scenario() -> None:
        async with InProcessCluster(options=JobsOptions(max_parallel_steps=4)) as cluster:
            result = await cluster.start(ScenarioJob, request("a"))
            await cluster.settle()
            (step,) = await cluster.storage().steps.get_for_job(result.job_id)
            worker = cluster.worker
            assert step.lease is not None
            assert (step.lease.host, step.lease.activation) == (worker.host, worker.activation_id)
            assert step.attempt == 1

    run(scenario())


def test_a_controller_whose_ownership_lease_ran_out_dispatches_nothing_more(run, script):
    """Its lease expired unrenewed (a frozen host, writes that never answered) and another
    host claimed the job: before it sends more steps, the old activation proves it still owns
    the job by a compare-and-set write, which loses, and it lets the job go."""

    async def scenario() -> None:
        options = JobsOptions(max_parallel_steps=4)
        async with InProcessCluster(options=options) as cluster:
            manager = cluster.manager()
            manager.ctx = replace(manager.ctx, owner=JobOwner(host="here", activation_epoch=1))
            for key in ("a", "b", "c"):
                script.behaviour[key].block = True
            result = await cluster.start(WindowJob, request("a", "b", "c"))  # two at a time
            await cluster.settle()
            activation = manager.live(result.job_id)
            assert activation is not None
            expired = cluster.clock.now() - timedelta(seconds=1)
            state = activation.state
            assert state.owner is not None
            state.owner = state.owner.model_copy(update={"lease_expires": expired})
            # Meanwhile another host claimed it (its lease had run out in storage too).
            stored = await cluster.storage().jobs.get(result.job_id)
            stored.owner = JobOwner(host="there", activation_epoch=2)
            await cluster.storage().jobs.save(stored)
            dispatched = activation.counters.dispatched
            script.release("a")  # a window slot frees: the old activation must not fill it
            await cluster.settle()
            assert activation.released
            assert activation.counters.dispatched == dispatched
            final = await cluster.storage().jobs.get(result.job_id)
            assert final.owner is not None and final.owner.host == "there"

    run(scenario())


def test_an_expired_lease_no_one_claimed_is_renewed_and_the_job_goes_on(run, script):
    """A lease that ran out while no other host claimed the job (a slow write, a pause) is
    renewed by the write that proves it: the activation goes on, and is not let go (a job
    activated from storage with an old lease would otherwise be let go and activated again
    at every report)."""

    async def scenario() -> None:
        async with InProcessCluster(options=JobsOptions(max_parallel_steps=4)) as cluster:
            manager = cluster.manager()
            manager.ctx = replace(manager.ctx, owner=JobOwner(host="here", activation_epoch=1))
            for key in ("a", "b", "c"):
                script.behaviour[key].block = True
            result = await cluster.start(WindowJob, request("a", "b", "c"))
            await cluster.settle()
            activation = manager.live(result.job_id)
            assert activation is not None and activation.state.owner is not None
            activation.state.owner = activation.state.owner.model_copy(
                update={"lease_expires": cluster.clock.now() - timedelta(seconds=1)}
            )
            script.release("a", "b", "c")
            await cluster.settle()
            assert not activation.released or activation.state.status.is_terminal
            final = await cluster.storage().jobs.get(result.job_id)
            assert final.status == JobStatus.COMPLETED_SUCCESSFULLY
            assert final.recovery_attempts == 0

    run(scenario())
