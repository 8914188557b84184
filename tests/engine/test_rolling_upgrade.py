"""Plans during a rolling upgrade: a job stores its plan apart only when every live host of its
type advertises plan storage; while one does not, the plan stays inline whatever its size;
once the last older host has left, new jobs store large plans apart again."""

from __future__ import annotations

from choreography_ray.jobs import JobsOptions, JobStatus
from choreography_ray.placement.capability import PLAN_STORAGE, HostAdvert, hosts_of_type_have
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, request


def advert(name: str, *caps: str) -> HostAdvert:
    return HostAdvert(name=name, node_id=name, job_types=["scenario"], capabilities=list(caps))


def test_plan_storage_counts_only_when_every_host_of_the_type_advertises_it() -> None:
    new, old = advert("new", PLAN_STORAGE), advert("old")
    other = HostAdvert(name="other", node_id="o", job_types=["unrelated"])
    assert hosts_of_type_have(["new"], {"new": new}, "scenario", PLAN_STORAGE)
    assert not hosts_of_type_have(
        ["new", "old"], {"new": new, "old": old}, "scenario", PLAN_STORAGE
    )
    assert hosts_of_type_have(
        ["new", "other"], {"new": new, "other": other}, "scenario", PLAN_STORAGE
    )
    # A host that has not advertised is taken as an older release.
    assert not hosts_of_type_have(["new", "silent"], {"new": new}, "scenario", PLAN_STORAGE)


def test_while_an_older_host_runs_plans_stay_inline_and_apart_once_it_left(run, script):
    older_host_running = True
    asked: list[str] = []

    async def plans_apart(job_type: str) -> bool:
        asked.append(job_type)
        return not older_host_running

    async def scenario():
        nonlocal older_host_running
        cluster = InProcessCluster(options=JobsOptions(max_inline_step_plan_size=0))
        await cluster.provider.initialize()
        cluster.plans_apart = plans_apart
        try:
            during = await cluster.start(ScenarioJob, request("a", "b"))
            await cluster.settle()
            inline = await cluster.storage().jobs.get(during.job_id)
            older_host_running = False  # the last older host left
            after = await cluster.start(ScenarioJob, request("c", "d"), job_id="after")
            await cluster.settle()
            apart = await cluster.storage().jobs.get(after.job_id)
            return inline, apart, await cluster.wait(during.job_id), await cluster.wait("after")
        finally:
            await cluster.close()

    inline, apart, first, second = run(scenario())
    assert asked == [ScenarioJob.name, ScenarioJob.name]
    assert inline.stored_step_plan_incarnation is None  # never stored apart
    assert apart.stored_step_plan_incarnation == 1
    assert first.status == second.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert sorted(step for step, _ in script.runs) == ["a", "b", "c", "d"]


def test_a_plan_too_large_for_the_record_while_it_must_stay_inline_fails_the_job_cleanly(
    run, script
):
    from choreography_ray.jobs import StartJobError
    from choreography_ray.storage.protocols import JobsStorage

    def document_limit(storage: JobsStorage) -> JobsStorage:
        class Jobs:
            def __getattr__(self, name):
                return getattr(storage.jobs, name)

            async def save(self, state):
                if state.plan:
                    raise ValueError("document too large")
                return await storage.jobs.save(state)

        return JobsStorage(storage.key, Jobs(), storage.steps, storage.plans)

    async def older_host_runs(job_type: str) -> bool:
        return False

    async def scenario():
        cluster = InProcessCluster(
            options=JobsOptions(max_inline_step_plan_size=0), wrap_storage=document_limit
        )
        await cluster.provider.initialize()
        cluster.plans_apart = older_host_runs
        try:
            result = await cluster.start(ScenarioJob, request("a", "b"))
            return result, await cluster.storage().jobs.get(result.job_id)
        finally:
            await cluster.close()

    result, state = run(scenario())
    assert result.error == StartJobError.UNKNOWN
    assert state.status == JobStatus.FAILED and state.plan is None
    [message] = state.status_changes[-1].exception_messages
    assert "must stay in the job record while a host of an older release runs" in message
    assert "document too large" in message
    assert script.runs == []
