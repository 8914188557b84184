"""A job tells its dispatcher each step's own type, so that a step goes only to a worker that
runs it: from the plan on a start, from the step records on a resume."""

from __future__ import annotations

import pytest

from choreography_ray.jobs import JobsOptions, JobStatus

from .fixtures import KeyRequest, KeyStep, ScenarioJob, SyncKeyStep, request


def test_the_dispatcher_hears_each_steps_type_on_start_and_on_resume(run, cluster, script):
    script.plan_override = lambda job, r: [
        job.create_step(SyncKeyStep, KeyRequest(key="a"), step_id="a"),
        job.create_step(KeyStep, KeyRequest(key="b"), step_id="b"),
        job.create_step(SyncKeyStep, KeyRequest(key="c"), step_id="c"),
    ]
    script.behaviour["b"].block = True
    heard: list[dict[str, str]] = []
    real = cluster.start_steps

    async def listening(job_key, job_id, job_type, starts, sticky, step_types=None):
        heard.append({s.step_id: step_types.of(s.step_id) for s in starts})
        return await real(job_key, job_id, job_type, starts, sticky, step_types)

    async def scenario():
        cluster.start_steps = listening
        result = await cluster.start(ScenarioJob, request())
        await cluster.settle()
        await cluster.crash()
        await cluster.manager().resume(result.job_id)  # b goes again
        script.release("b")
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert heard == [
        {"a": SyncKeyStep.name, "b": KeyStep.name, "c": SyncKeyStep.name},
        {"b": KeyStep.name},
    ]


@pytest.mark.parametrize("options", [JobsOptions(max_parallel_steps=8, worker_wait_timeout=0)])
def test_before_preparing_the_check_names_the_plans_step_types(run, cluster, script):
    """With `worker_wait_timeout=0` a step type no worker runs fails the job before its steps
    are prepared (the reference system's first moment): the check hears every type."""
    script.plan_override = lambda job, r: [
        job.create_step(SyncKeyStep, KeyRequest(key="a")),
        job.create_step(KeyStep, KeyRequest(key="b")),
        job.create_step(SyncKeyStep, KeyRequest(key="c")),
    ]
    asked: list[tuple[str, list[str]]] = []

    async def check(job_key, job_type, step_types=()):
        asked.append((job_type, list(step_types)))

    async def scenario():
        cluster.check_placement = check
        result = await cluster.start(ScenarioJob, request())
        return await cluster.wait(result.job_id)

    assert run(scenario()).status == JobStatus.COMPLETED_SUCCESSFULLY
    assert asked == [(ScenarioJob.name, [SyncKeyStep.name, KeyStep.name])]
