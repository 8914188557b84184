"""The ownership lease and the reconciliation sweep: no unfinished job is ever left idle.

The seed's known limitation — a lost acknowledgement of the Running write leaves a job idle
until a restart — does not exist here: the job's owner lease runs out, and the sweep claims
and resumes it."""

from __future__ import annotations

from datetime import timedelta

from choreography_ray.jobs import JobsOptions
from choreography_ray.jobs.status import JobStatus
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, request
from .test_ownership import host as manager_of

LEASE = 60.0


class _AckLost:
    """Job storage whose Running writes land but are reported failed while `lost` is set."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.lost = True

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def save(self, state):
        version = await self._inner.save(state)
        if self.lost and state.status == JobStatus.RUNNING:
            raise ConnectionError("the acknowledgement of the write was lost")
        return version


class _Storage:
    def __init__(self, inner) -> None:
        self._inner = inner
        self.jobs = _AckLost(inner.jobs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _options() -> JobsOptions:
    return JobsOptions(
        max_parallel_steps=8,
        job_ownership_lease=timedelta(seconds=LEASE),
        step_delivery_max_attempts=1,
    )


def test_a_job_whose_running_acknowledgement_was_lost_is_resumed_by_the_sweep(run, script):
    cluster = InProcessCluster(options=_options())
    storage = _Storage(cluster.storage())
    host = manager_of(cluster, "host-a", {"host-a"}, storage)
    cluster.managers[cluster.manager().ctx.key] = host  # reports reach host-a

    async def scenario():
        async with cluster:
            await cluster.start(ScenarioJob, request("a"), job_id="idle")  # via host-a
            await cluster.settle()
            stored = await cluster.storage().jobs.get("idle")
            for _ in range(4):  # recovery after the storage failure tries, and gives up
                await cluster.advance(60)
            idle = (await cluster.storage().jobs.get("idle")).status
            ran = script.ran("a")
            storage.jobs.lost = False
            report = await host.reconcile()
            return stored, idle, ran, report, await cluster.wait("idle")

    _, idle, ran, report, state = run(scenario())
    assert idle == JobStatus.RUNNING and ran == 0  # stored Running, nothing dispatched
    assert report.resumed == ["idle"]
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert script.ran("a") == 1


def test_the_sweep_takes_over_a_job_whose_owner_lives_but_whose_lease_expired(run, script):
    cluster = InProcessCluster(options=_options())
    alive = {"host-a", "host-b"}

    async def scenario():
        async with cluster:
            script.behaviour["a"].block = True
            first = manager_of(cluster, "host-a", alive)
            second = manager_of(cluster, "host-b", alive)
            cluster.managers[first.ctx.key] = first
            result = await first.start(ScenarioJob, request("a"))
            await cluster.settle()
            held = await second.reconcile()  # host-a's activation renews its lease
            await cluster.advance(LEASE)
            still = await second.reconcile()
            first.close()  # its activation is lost; host-a still answers pings
            await cluster.advance(LEASE)
            cluster.managers[first.ctx.key] = second
            taken = await second.reconcile()
            await cluster.settle()
            script.release("a")
            stored = await cluster.wait(result.job_id)
            return held, still, taken, stored

    held, still, taken, stored = run(scenario())
    assert held.queued == [] and still.queued == []
    assert taken.resumed == [stored.id]
    assert stored.owner.host == "host-b"
    assert stored.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert script.ran("a") == 1  # the run on the live worker was kept (sticky, refused twice)
