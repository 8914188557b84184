from choreography_ray.jobs import JobStatus

from .fixtures import ScenarioJob, request


def test_a_job_of_three_steps_completes(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a", "b", "c"))
        state = await cluster.wait(result.job_id)
        return result, state

    result, state = run(scenario())
    assert result.error is None
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 3
    assert sorted(k for k, _ in script.runs) == ["a", "b", "c"]
