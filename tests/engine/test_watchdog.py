"""The job's watchdog: lost reports counted from storage; with leases on, a run restarted
only when its host left the cluster and its lease expired (the recovery seed's lease rule)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from choreography_ray.jobs import Job, JobsOptions, JobStep, StepContext
from choreography_ray.jobs.status import JobStatus, JobStepStatus
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, request, wrap_steps

LEASE = 30.0
INTERVAL = 10.0


def _leased(workers: int = 2, lease: float = LEASE) -> InProcessCluster:
    return InProcessCluster(
        options=JobsOptions(
            max_parallel_steps=8,
            step_lease_timeout=timedelta(seconds=lease),
            job_watchdog_interval=timedelta(seconds=INTERVAL),
        ),
        workers=workers,
    )


def test_a_run_whose_host_left_is_restarted_once_its_lease_expired(run, script):
    cluster = _leased()

    async def scenario():
        async with cluster:
            for key in "ab":
                script.behaviour[key].block = True
            result = await cluster.start(ScenarioJob, request("a", "b"))
            await cluster.settle()
            # Nobody tells the job: only the watchdog can notice.
            await cluster.lose_worker("worker-1", tell=False)
            await cluster.advance(INTERVAL)
            await cluster.advance(INTERVAL)
            early = len(script.runs)  # 20 s: the lease has not expired
            await cluster.advance(INTERVAL)
            await cluster.advance(INTERVAL)
            late = len(script.runs)
            script.release("a", "b")
            return early, late, await cluster.wait(result.job_id)

    early, late, state = run(scenario())
    assert early == 2
    assert late == 3
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 2


def test_a_run_on_a_live_host_is_left_alone_however_old_its_lease(run, script):
    cluster = _leased()

    async def scenario():
        async with cluster:
            script.behaviour["a"].block = True
            result = await cluster.start(ScenarioJob, request("a"))
            await cluster.settle()
            sent = len(cluster.sent)
            for _ in range(10):
                await cluster.advance(INTERVAL)
            resent = len(cluster.sent) - sent
            script.release("a")
            return resent, await cluster.wait(result.job_id)

    resent, state = run(scenario())
    assert resent == 0
    assert script.ran("a") == 1
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_an_outcome_stored_but_never_reported_is_counted_from_storage(run, script, options):
    cluster = InProcessCluster(options=options)  # leases off

    async def scenario():
        async with cluster:
            real = cluster.report
            cluster.report = _dropped
            result = await cluster.start(ScenarioJob, request("a", "b"))
            await cluster.settle()
            cluster.report = real
            running = (await cluster.manager().get(result.job_id)).status
            interval = options.job_watchdog_interval.total_seconds()
            await cluster.advance(interval)
            await cluster.advance(interval)
            await cluster.advance(interval)
            return running, await cluster.wait(result.job_id)

    running, state = run(scenario())
    assert running == JobStatus.RUNNING
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 2
    assert script.ran("a") == 1 and script.ran("b") == 1


async def _dropped(job_key, job_id, reports) -> None:
    """A report that never arrives."""


class Count(BaseModel):
    n: int = 0


GATES: dict[int, asyncio.Event] = {}


class CheckpointingStep(JobStep[Count, Count, int], name="watchdog.checkpointing-step"):
    """Checkpoints, then waits for gate n before the next checkpoint."""

    def initialize_state(self, request: Count) -> Count:
        return Count()

    async def perform(self, state: Count, ctx: StepContext) -> int:
        for n in range(3):
            state.n = n
            ctx.checkpoint(state)
            await GATES.setdefault(n, asyncio.Event()).wait()
        return state.n


class CheckpointingJob(Job[Count], name="watchdog.checkpointing-job"):
    keep_after_completed = True

    def prepare_steps(self, request: Count) -> list:
        return [self.create_step(CheckpointingStep, Count())]


def test_a_checkpoint_renews_the_lease_once_a_third_of_it_has_passed(run):
    cluster = _leased(workers=1)
    CheckpointingStep.checkpoint_after_every_batch = True
    GATES.clear()

    async def heartbeat(job_id):
        await cluster.settle()
        [step] = await cluster.storage().steps.get_for_job(job_id)
        return step.lease.heartbeat

    async def scenario():
        async with cluster:
            result = await cluster.start(CheckpointingJob, Count())
            first = await heartbeat(result.job_id)
            await cluster.clock.advance(LEASE / 3 - 1)
            GATES.setdefault(0, asyncio.Event()).set()  # a checkpoint before a third passed
            second = await heartbeat(result.job_id)
            await cluster.clock.advance(2)
            GATES.setdefault(1, asyncio.Event()).set()  # a checkpoint after a third passed
            third = await heartbeat(result.job_id)
            GATES.setdefault(2, asyncio.Event()).set()
            await cluster.wait(result.job_id)
            return first, second, third

    first, second, third = run(scenario())
    assert second == first
    assert (third - first).total_seconds() == LEASE / 3 + 1


def test_a_renewed_lease_holds_a_restart_back_even_after_its_host_left(run):
    cluster = _leased(workers=2)
    CheckpointingStep.checkpoint_after_every_batch = True
    GATES.clear()

    async def scenario():
        async with cluster:
            result = await cluster.start(CheckpointingJob, Count())  # worker-0 runs it
            await cluster.settle()
            await cluster.clock.advance(31)
            GATES.setdefault(0, asyncio.Event()).set()  # renews the heartbeat at 31 s
            await cluster.settle()
            await cluster.advance(10)
            await cluster.lose_worker("worker-0", tell=False)
            sent = len(cluster.sent)
            await cluster.advance(10)  # 51 s: host gone, lease (31 + 30) not expired
            await cluster.advance(10)
            held = len(cluster.sent) - sent
            await cluster.advance(10)  # 71 s: expired
            restarted = len(cluster.sent) - sent
            for n in range(3):
                GATES.setdefault(n, asyncio.Event()).set()
            return held, restarted, await cluster.wait(result.job_id)

    held, restarted, state = run(scenario())
    assert (held, restarted) == (0, 1)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


class _LeaseLess:
    """Step storage as a release without leases writes it: every record saved has none."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def save(self, state: Any) -> Any:
        return await self._inner.save(state.model_copy(update={"lease": None}))

    async def save_many(self, states: list[Any]) -> Any:
        return await self._inner.save_many([s.model_copy(update={"lease": None}) for s in states])


def test_a_running_step_without_a_lease_is_started_again_one_lease_period_after_its_change(
    run, script
):
    """The recovery seed: a step without a lease (written by a release that did not know
    them) is left alone for one lease period after its last change, then started again;
    harmless for a step still running, which answers that it has already started."""
    cluster = InProcessCluster(
        options=JobsOptions(
            max_parallel_steps=8,
            step_lease_timeout=timedelta(seconds=LEASE),
            job_watchdog_interval=timedelta(seconds=INTERVAL),
        ),
        wrap_storage=wrap_steps(_LeaseLess),
    )

    async def scenario():
        async with cluster:
            script.behaviour["a"].block = True
            result = await cluster.start(ScenarioJob, request("a"))
            await cluster.settle()
            [step] = await cluster.storage().steps.get_for_job(result.job_id)
            sent = len(cluster.sent)
            await cluster.advance(INTERVAL)
            await cluster.advance(INTERVAL)
            early = len(cluster.sent) - sent  # 20 s: within one lease period
            await cluster.advance(INTERVAL)
            late = len(cluster.sent) - sent  # 30 s: one lease period after its change
            script.release("a")
            return step, early, late, await cluster.wait(result.job_id)

    step, early, late, state = run(scenario())
    assert step.status == JobStepStatus.RUNNING and step.lease is None
    assert (early, late) == (0, 1)
    assert cluster.sent[-1] == ("worker-0", step.id)  # back to the host that runs it
    assert script.ran("a") == 1  # the run in progress answered that it had started
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


ASKED: list[frozenset[str]] = []


class NoHostsJob(ScenarioJob, name="tests.watchdog.no-hosts-job"):
    """Reads cluster membership its own way: no host counts as part of the cluster."""

    def get_active_hosts(self, hosts: frozenset[str]) -> frozenset[str]:
        ASKED.append(hosts)
        return frozenset()


def test_a_jobs_get_active_hosts_override_decides_whose_runs_are_lost(run, script):
    """`Job.get_active_hosts` changes how membership is read: here it says no host is alive,
    so a run whose lease expired is started again although its host lives (left alone
    otherwise: `test_a_run_on_a_live_host_is_left_alone_however_old_its_lease`)."""
    cluster = _leased(workers=1)
    ASKED.clear()

    async def scenario():
        async with cluster:
            script.behaviour["a"].block = True
            result = await cluster.start(NoHostsJob, request("a"))
            await cluster.settle()
            sent = len(cluster.sent)
            for _ in range(3):
                await cluster.advance(INTERVAL)
            restarted = len(cluster.sent) - sent
            script.release("a")
            return restarted, await cluster.wait(result.job_id)

    restarted, state = run(scenario())
    assert ASKED and ASKED[0] == frozenset({"worker-0"})
    assert restarted == 1
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
