"""`retry_failed`: a finished job's failed steps run again under their identities, in a new
execution generation; its successes stay as stored, and its counts come out exact."""

from __future__ import annotations

from typing import Any

import pytest

from choreography_ray.jobs import JobStatus, JobStepStatus
from choreography_ray.jobs.errors import CannotRetryFailedError, RetryFailedRefused

from .fixtures import RetryingJob, ScenarioJob, request, wrap_steps


async def _finished(cluster: Any, job: Any, *keys: str, **kwargs: Any) -> Any:
    result = await cluster.start(job, request(*keys, **kwargs))
    return result.job_id, await cluster.wait(result.job_id)


async def _steps(cluster: Any, job_id: str) -> dict[str, Any]:
    records = await cluster.storage().steps.get_all_for_job(job_id)
    return {record.name: record for record in records}


def test_the_failed_steps_run_again_and_replace_their_failures_in_the_counts(run, cluster, script):
    script.behaviour["b"].fail = True
    script.behaviour["c"].fail = True

    async def scenario():
        job_id, first = await _finished(cluster, ScenarioJob, "a", "b", "c")
        before = await _steps(cluster, job_id)
        script.behaviour["b"].fail = False
        rerun = await cluster.retry_failed(job_id)
        return first, before, rerun, await cluster.wait(job_id), await _steps(cluster, job_id)

    first, before, rerun, after, steps = run(scenario())
    assert first.status == JobStatus.COMPLETED_WITH_FAILURES
    assert (first.progress.successful_steps, first.progress.failed_steps) == (1, 2)
    assert sorted(rerun) == sorted([before["b"].id, before["c"].id])
    assert after.status == JobStatus.COMPLETED_WITH_FAILURES
    assert (after.progress.total_steps, after.progress.successful_steps) == (3, 2)
    assert after.progress.failed_steps == 1  # replaced, not added
    assert after.execution_generation == first.execution_generation + 1
    assert after.rerun_steps == []
    assert sorted(key for key, _ in script.runs) == ["a", "b", "b", "c", "c"]
    # The success is untouched: same record, same version; the rerun ones keep their ids.
    assert steps["a"].version == before["a"].version
    assert {name: s.id for name, s in steps.items()} == {n: s.id for n, s in before.items()}
    assert steps["b"].status == JobStepStatus.COMPLETED_SUCCESSFULLY
    assert steps["b"].generation == after.execution_generation
    history = [JobStatus(c.status) for c in after.status_changes]
    assert history[-3:] == [
        JobStatus.COMPLETED_WITH_FAILURES,
        JobStatus.RUNNING,
        JobStatus.COMPLETED_WITH_FAILURES,
    ]


def test_only_the_named_steps_run_again(run, cluster, script):
    script.behaviour["b"].fail = True
    script.behaviour["c"].fail = True

    async def scenario():
        job_id, _ = await _finished(cluster, ScenarioJob, "a", "b", "c")
        before = await _steps(cluster, job_id)
        script.behaviour["b"].fail = False
        script.behaviour["c"].fail = False
        rerun = await cluster.retry_failed(job_id, [before["b"].id])
        return before, rerun, await cluster.wait(job_id)

    before, rerun, after = run(scenario())
    assert rerun == (before["b"].id,)
    assert after.status == JobStatus.COMPLETED_WITH_FAILURES
    assert (after.progress.successful_steps, after.progress.failed_steps) == (2, 1)
    assert script.ran("c") == 1


def test_a_job_whose_failures_all_succeed_completes_successfully(run, cluster, script):
    script.behaviour["b"].fail = True

    async def scenario():
        job_id, _ = await _finished(cluster, ScenarioJob, "a", "b")
        script.behaviour["b"].fail = False
        await cluster.retry_failed(job_id)
        return await cluster.wait(job_id)

    after = run(scenario())
    assert after.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert (after.progress.successful_steps, after.progress.failed_steps) == (2, 0)


def test_each_step_run_again_has_its_retry_policy_afresh(run, cluster, script):
    script.behaviour["a"].fail_times = 99  # RetryingJob: 3 attempts

    async def scenario():
        result = await cluster.start(RetryingJob, request("a"))
        job_id = result.job_id
        await cluster.advance(3600)
        await cluster.retry_failed(job_id)
        await cluster.advance(3600)
        return await cluster.wait(job_id)

    after = run(scenario())
    assert after.status == JobStatus.COMPLETED_WITH_FAILURES
    assert after.progress.failed_steps == 1
    assert [attempt for key, attempt in script.runs] == [1, 2, 3, 1, 2, 3]


def test_steps_a_failed_stage_left_unreachable_run_once_it_passes(run, cluster, script):
    script.behaviour["a"].fail = True

    async def scenario():
        job_id, first = await _finished(cluster, ScenarioJob, "a", "b", stages={"b": 1})
        script.behaviour["a"].fail = False
        await cluster.retry_failed(job_id)
        return first, await cluster.wait(job_id)

    first, after = run(scenario())
    assert (first.progress.failed_steps, first.progress.unreachable_steps) == (1, 1)
    assert after.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert after.progress.successful_steps == 2
    assert (after.progress.failed_steps, after.progress.unreachable_steps) == (0, 0)
    assert script.ran("b") == 1


def test_a_stopped_job_runs_its_failed_and_unfinished_steps(run, cluster, script):
    script.behaviour["a"].fail = True
    script.behaviour["b"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a", "b"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        stopped = await cluster.wait(result.job_id)
        script.behaviour["a"].fail = False
        script.behaviour["b"].block = False
        await cluster.retry_failed(result.job_id)
        return stopped, await cluster.wait(result.job_id)

    stopped, after = run(scenario())
    assert stopped.status == JobStatus.STOPPED
    assert stopped.progress.failed_steps == 1
    assert after.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert (after.progress.successful_steps, after.progress.failed_steps) == (2, 0)
    assert after.progress.stopped_steps == 0


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        ("success", CannotRetryFailedError.JOB_IS_NOT_FINISHED),
        ("running", CannotRetryFailedError.JOB_IS_NOT_FINISHED),
        ("a-success", CannotRetryFailedError.NOT_A_FAILED_STEP),
        ("unknown-step", CannotRetryFailedError.NOT_A_FAILED_STEP),
        ("stopped-without-failures", CannotRetryFailedError.NO_FAILED_STEPS),
    ],
)
def test_a_refusal_names_why_and_changes_nothing(run, cluster, script, setup, code):
    script.behaviour["b"].fail = setup != "success"
    script.behaviour["c"].block = setup in ("running", "stopped-without-failures")
    keys = ("a", "c") if setup == "stopped-without-failures" else ("a", "b", "c")

    async def scenario():
        result = await cluster.start(ScenarioJob, request(*keys))
        await cluster.settle()
        if setup == "stopped-without-failures":
            await cluster.manager().stop(result.job_id)
            await cluster.settle()
        before = await cluster.manager().get(result.job_id)
        steps = await _steps(cluster, result.job_id)
        named = {"a-success": [steps["a"].id], "unknown-step": ["nope"]}.get(setup)
        with pytest.raises(RetryFailedRefused) as refused:
            await cluster.retry_failed(result.job_id, named)
        after = await cluster.storage().jobs.find(result.job_id)
        script.release("c")
        return before, after, refused.value

    before, after, error = run(scenario())
    assert error.code == code
    assert after.version == before.version
    assert after.status == before.status
    if setup == "unknown-step":
        assert "nope" in str(error)


def test_a_crash_before_the_steps_were_reset_is_finished_by_recovery(run, script):
    """Running and the steps to run again are written first: a host lost before the step
    records were reset leaves a Running job, and recovery resets them and runs them."""
    from choreography_ray.testing import InProcessCluster

    failing = {"on": False}

    class FailingWrites:
        def __init__(self, steps: Any) -> None:
            self._steps = steps

        def __getattr__(self, name: str) -> Any:
            return getattr(self._steps, name)

        async def save_many(self, states: Any) -> Any:
            if failing["on"]:
                raise ConnectionError("storage went away")
            return await self._steps.save_many(states)

    cluster = InProcessCluster(wrap_storage=wrap_steps(FailingWrites))
    script.behaviour["b"].fail = True

    async def scenario():
        async with cluster:
            job_id, _ = await _finished(cluster, ScenarioJob, "a", "b")
            failing["on"] = True
            with pytest.raises(RetryFailedRefused) as refused:
                await cluster.retry_failed(job_id)
            stored = await cluster.storage().jobs.find(job_id)
            await cluster.crash()
            failing["on"] = False
            script.behaviour["b"].fail = False
            await (await cluster.manager().rehydrate())
            return refused.value, stored, await cluster.wait(job_id)

    error, stored, after = run(scenario())
    assert error.code == CannotRetryFailedError.UNKNOWN
    assert stored.status == JobStatus.RUNNING
    assert stored.rerun_steps
    assert after.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert (after.progress.successful_steps, after.progress.failed_steps) == (2, 0)
    assert script.ran("b") == 2
