"""Concurrency keys, in process: at most `max_running` jobs of one key run at once, counted
in storage (so two controller hosts over one storage keep it together, and a host's loss
takes nothing), the others wait visibly and start as places free."""

from __future__ import annotations

import pytest

from choreography_ray.engine.clock import FakeClock
from choreography_ray.engine.concurrency import KEYS_JOB
from choreography_ray.jobs import (
    ConcurrencyKey,
    InvalidOptionError,
    Job,
    JobsOptions,
    JobStatus,
    TypeRegistryError,
)
from choreography_ray.testing import InProcessCluster

from . import fixtures
from .fixtures import TenantJob, TenantRequest, tenant


async def holders(cluster: InProcessCluster, key: str) -> list[str]:
    record = await cluster.storage().steps.find(KEYS_JOB, key)
    return [] if record is None or record.state is None else record.state.data["holders"]


def test_a_key_at_its_limit_makes_the_next_job_wait_visibly(run, cluster, script):
    for key in ("a1", "a2", "a3", "b1"):
        script.behaviour[key].block = True

    async def scenario():
        first = await cluster.start(TenantJob, tenant("a", "a1"))
        second = await cluster.start(TenantJob, tenant("a", "a2"))
        third = await cluster.start(TenantJob, tenant("a", "a3"))
        other = await cluster.start(TenantJob, tenant("b", "b1"))
        await cluster.settle()
        waiting = await cluster.manager().get(third.job_id)
        assert cluster.manager().outstanding_steps == 3  # the waiting job asks for no node
        held = await holders(cluster, "a")
        ran_before = sorted(k for k, _ in script.runs)
        script.release("a1")  # a place of key a frees: the waiting job is admitted at once
        await cluster.settle()
        admitted = await cluster.manager().get(third.job_id)
        script.release("a2", "a3", "b1")
        ids = (first.job_id, second.job_id, third.job_id, other.job_id)
        return waiting, held, ran_before, admitted, [await cluster.wait(i) for i in ids]

    waiting, held, ran_before, admitted, done = run(scenario())
    assert ran_before == ["a1", "a2", "b1"]  # key b is not held back by key a
    assert waiting.status == JobStatus.RUNNING
    assert waiting.waiting_for_key is not None
    assert waiting.waiting_for_key.text() == "waiting: key a at its limit 2"
    assert waiting.concurrency_key == "a"
    assert len(held) == 2 and waiting.id not in held
    assert admitted.waiting_for_key is None
    assert all(state.status == JobStatus.COMPLETED_SUCCESSFULLY for state in done)


def test_jobs_waiting_on_a_host_are_admitted_first_come_first(run, cluster, script):
    for key in ("a1", "a2", "a3", "a4"):
        script.behaviour[key].block = True

    async def scenario():
        for key in ("a1", "a2", "a3", "a4"):
            await cluster.start(TenantJob, tenant("a", key))
            await cluster.clock.advance(1)  # a3 waits before a4
        await cluster.settle()
        script.release("a1")
        await cluster.settle()
        ran = [k for k, _ in script.runs]
        script.release("a2", "a3", "a4")
        return ran

    assert run(scenario()) == ["a1", "a2", "a3"]


def test_two_controller_hosts_over_one_storage_keep_the_limit_together_and_after_a_loss(
    run, script
):
    """Host A runs two jobs of key a; host B's job of key a waits, although B runs none
    (the count comes from storage). A is lost: its jobs still hold their places while they
    are unfinished; B's job starts only once they finished, recovered on B."""
    clock = FakeClock()
    options = JobsOptions(max_parallel_steps=8)
    host_a = InProcessCluster(options=options, clock=clock)
    host_b = InProcessCluster(host_a.provider, options=options, clock=clock)
    for key in ("a1", "a2", "a3"):
        script.behaviour[key].block = True

    async def scenario():
        async with host_a:
            first = await host_a.start(TenantJob, tenant("a", "a1"))
            second = await host_a.start(TenantJob, tenant("a", "a2"))
            await host_a.settle()
            third = await host_b.start(TenantJob, tenant("a", "a3"))
            await host_b.settle()
            on_b = await host_b.manager().get(third.job_id)
            await host_a.crash()  # host A and its runs are gone; its jobs stay Running
            await host_b.advance(5)  # B's waiting job asks again: the places are still held
            still = await host_b.manager().get(third.job_id)
            ran_while_held = sorted(k for k, _ in script.runs)
            script.release("a1", "a2")
            # Host A's jobs are recovered on B and finish; then B's waiting job starts.
            await (await host_b.manager().rehydrate())
            await host_b.settle()
            await host_b.advance(1)
            after = await host_b.manager().get(third.job_id)
            script.release("a3")
            await host_b.settle()
            finished = [await host_b.manager().get(job.job_id) for job in (first, second, third)]
            await host_b.close()
            return on_b, still, ran_while_held, after, finished

    on_b, still, ran_while_held, after, finished = run(scenario())
    assert on_b.waiting_for_key is not None and still.waiting_for_key is not None
    assert ran_while_held == ["a1", "a2"]
    assert after.waiting_for_key is None
    assert [state.status for state in finished] == [JobStatus.COMPLETED_SUCCESSFULLY] * 3
    assert sorted(k for k, _ in script.runs).count("a3") == 1


def test_a_stopped_job_frees_its_place_and_waits_again_when_resumed(run, cluster, script):
    for key in ("a1", "a2", "a3"):
        script.behaviour[key].block = True

    async def scenario():
        first = await cluster.start(TenantJob, tenant("a", "a1"))
        await cluster.start(TenantJob, tenant("a", "a2"))
        third = await cluster.start(TenantJob, tenant("a", "a3"))
        await cluster.settle()
        await cluster.manager().stop(first.job_id)
        await cluster.advance(1)  # the waiting job asks again: the stopped one holds nothing
        admitted = await cluster.manager().get(third.job_id)
        await cluster.manager().resume(first.job_id)
        await cluster.settle()
        again = await cluster.manager().get(first.job_id)
        script.release("a1", "a2", "a3")
        await cluster.advance(1)
        return admitted, again, await cluster.wait(first.job_id)

    admitted, again, done = run(scenario())
    assert admitted.waiting_for_key is None
    assert again.status == JobStatus.RUNNING and again.waiting_for_key is not None
    assert done.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_start_names_the_key_and_a_callable_reads_it_from_the_request(run, cluster, script):
    class ByLength(TenantJob, name="scenario.by-length-job"):
        concurrency = ConcurrencyKey(lambda request: f"len-{len(request.keys)}", max_running=1)

    async def scenario():
        named = await cluster.start(TenantJob, tenant("a", "x"), concurrency_key="vip")
        computed = await cluster.start(ByLength, tenant("a", "y", "z"))
        return (await cluster.wait(named.job_id), await cluster.wait(computed.job_id))

    named, computed = run(scenario())
    assert (named.concurrency_key, computed.concurrency_key) == ("vip", "len-2")


def test_a_key_a_class_cannot_keep_or_a_bad_key_is_refused(run, cluster, script):
    with pytest.raises(TypeRegistryError, match="'region' is not a field"):

        class Wrong(Job[TenantRequest], name="scenario.wrong-key-job"):
            concurrency = ConcurrencyKey("region", max_running=1)

    with pytest.raises(TypeRegistryError, match="at least 1"):
        ConcurrencyKey("tenant", max_running=0)

    async def scenario():
        with pytest.raises(InvalidOptionError, match="no concurrency limit"):
            await cluster.start(fixtures.ScenarioJob, fixtures.request("a"), concurrency_key="k")
        with pytest.raises(InvalidOptionError, match="concurrency_key"):
            await cluster.start(TenantJob, tenant(" padded "))

    run(scenario())


def test_a_job_without_a_key_reads_no_key_record(run, cluster, script):
    """A job with no key pays nothing: nothing is read or written for keys."""

    async def scenario():
        result = await cluster.start(fixtures.ScenarioJob, fixtures.request("a", "b"))
        state = await cluster.wait(result.job_id)
        return state, await cluster.storage().steps.get_all_for_job(KEYS_JOB)

    state, records = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY and records == []
