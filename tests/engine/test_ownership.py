"""At most one live activation per job: activating claims the job by compare-and-set."""

from __future__ import annotations

import pytest

from choreography_ray.engine.context import EngineContext
from choreography_ray.engine.manager import JobsManager
from choreography_ray.jobs import JobOwner, JobStatus, OwnedElsewhereError, default_registry
from choreography_ray.recovery import Rehydration

from .fixtures import ScenarioJob, request


def host(cluster, name: str, alive: set[str], storage=None) -> JobsManager:
    """The jobs manager of controller host `name`, which takes the hosts in `alive` as live."""

    async def owner_alive(owner: JobOwner) -> bool:
        return owner.host in alive

    base = cluster.manager().ctx
    return JobsManager(
        EngineContext(
            key=base.key,
            storage=storage or base.storage,
            registry=default_registry,
            options=base.options,
            clock=base.clock,
            dispatcher=cluster,
            owner=JobOwner(host=name, activation_epoch=1),
            owner_alive=owner_alive,
        ),
        recovery=Rehydration,
    )


def test_a_job_started_on_a_host_is_owned_by_it_and_another_live_host_refuses_it(
    run, cluster, script
):
    script.behaviour["a"].block = True
    alive = {"host-a", "host-b"}
    first, second = host(cluster, "host-a", alive), host(cluster, "host-b", alive)

    async def scenario():
        result = await first.start(ScenarioJob, request("a"))
        await cluster.settle()
        stored = await cluster.storage().jobs.get(result.job_id)
        with pytest.raises(OwnedElsewhereError) as raised:
            await second.stop(result.job_id)
        return stored, raised.value

    stored, refused = run(scenario())
    assert stored.owner.host == "host-a"
    assert refused.host == "host-a"


def test_a_job_whose_owner_is_gone_is_taken_over_by_compare_and_set(run, cluster, script):
    script.behaviour["a"].block = True
    alive = {"host-a", "host-b"}
    first, second = host(cluster, "host-a", alive), host(cluster, "host-b", alive)

    async def scenario():
        result = await first.start(ScenarioJob, request("a"))
        await cluster.settle()
        alive.discard("host-a")  # its node died
        await second.stop(result.job_id)
        await cluster.settle()
        return await cluster.storage().jobs.get(result.job_id)

    state = run(scenario())
    assert state.owner.host == "host-b"
    assert state.status == JobStatus.STOPPED


def test_starting_an_existing_job_again_claims_it_like_any_activation(run, cluster, script):
    """A start with the id of a job another live host owns answers what the job is and takes
    nothing; one whose owner is gone is taken over, so the activation it leaves owns the job."""
    from choreography_ray.jobs import StartJobError

    script.behaviour["a"].block = True
    alive = {"host-a", "host-b"}
    first, second = host(cluster, "host-a", alive), host(cluster, "host-b", alive)

    async def scenario():
        await first.start(ScenarioJob, request("a"), job_id="j")
        await cluster.settle()
        again = await second.start(ScenarioJob, request("a"), job_id="j")
        kept = (await cluster.storage().jobs.get("j")).owner.host
        alive.discard("host-a")  # host-a dies
        taken = await second.start(ScenarioJob, request("a"), job_id="j")
        return again, kept, taken, await cluster.storage().jobs.get("j"), second.live("j")

    again, kept, taken, stored, live = run(scenario())
    assert again.error == StartJobError.ALREADY_BEEN_PREPARED and kept == "host-a"
    assert taken.error == StartJobError.ALREADY_BEEN_PREPARED
    assert stored.owner.host == "host-b" and live is not None


def test_the_status_history_names_the_host_of_each_change_and_the_record_its_progress(
    run, cluster, script
):
    """What the console tells the story from: which host made each change (a change of host
    is a recovery elsewhere), and the progress each write of the job saw."""
    script.behaviour["a"].block = True
    alive = {"host-a", "host-b"}
    first, second = host(cluster, "host-a", alive), host(cluster, "host-b", alive)

    async def scenario():
        result = await first.start(ScenarioJob, request("a", "b"))
        await cluster.settle()
        alive.discard("host-a")
        await second.stop(result.job_id)
        await cluster.settle()
        return await cluster.storage().jobs.get(result.job_id)

    state = run(scenario())
    hosts = [(JobStatus(c.status).name, c.host) for c in state.status_changes]
    assert hosts[0] == ("PREPARING_JOB", "host-a")
    assert hosts[-1] == ("STOPPED", "host-b")
    assert state.progress_history[0] == (0, 0)  # noted by the job's first write
