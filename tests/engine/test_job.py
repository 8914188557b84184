"""Job scenarios: starting, resuming, completing and keeping state (reference §h, for_Job)."""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.engine.messages import StartOutcome, StartResult
from choreography_ray.engine.ports import Dispatched
from choreography_ray.jobs import (
    JobsOptions,
    JobStatus,
    JobStepStatus,
    ResumeJobFailed,
    ResumeJobSuccess,
    StartJobError,
    StartJobStepError,
    StopJobError,
    StopJobFailed,
)
from choreography_ray.jobs.errors import (
    CannotResumeJobError,
    NoEligibleJobWorker,
    RemoveJobError,
    RemoveJobFailed,
)
from choreography_ray.testing import InProcessCluster

from .fixtures import ClearingJob, RetryingJob, ScenarioJob, WindowJob, request

# -- when starting --------------------------------------------------------------------------


def test_when_starting_with_fifty_steps_every_step_runs_once(run, cluster, script, options):
    async def scenario():
        result = await cluster.start(ScenarioJob, request(*[f"s{n:02}" for n in range(50)]))
        return result, await cluster.wait(result.job_id)

    result, state = run(scenario())
    assert result.error is None
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 50
    assert sorted(k for k, _ in script.runs) == [f"s{n:02}" for n in range(50)]
    assert cluster.worker.peak_parallel <= options.max_parallel_steps


def test_when_starting_the_history_walks_every_status_in_order(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert [c.status for c in state.status_changes] == [
        JobStatus.PREPARING_JOB,
        JobStatus.PREPARING_STEPS,
        JobStatus.STARTING_STEPS,
        JobStatus.RUNNING,
        JobStatus.COMPLETED_SUCCESSFULLY,
    ]
    assert state.plan is None and state.is_prepared


def test_when_starting_hooks_run_in_order(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.wait(result.job_id)

    run(scenario())
    assert script.hooks == [
        "on_before_starting_job_steps",
        "on_before_dispatching_job_steps",
        "on_step_completed_or_stopped",
        "on_all_steps_completed",
    ]
    [context] = script.dispatch_contexts
    assert context.initialization_may_be_incomplete is False and context.resuming is False


def test_when_starting_and_the_only_step_fails_to_start(run, cluster, script):
    async def failing(job_key, job_id, job_type, starts, sticky, step_types=None):
        return Dispatched(
            [
                StartResult(s.step_id, StartOutcome.FAILED, StartJobStepError.UNKNOWN, "no")
                for s in starts
            ]
        )

    cluster.start_steps = failing

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        return result, await cluster.wait(result.job_id)

    result, state = run(scenario())
    assert result.error == StartJobError.ALL_JOB_STEPS_FAILED_STARTING
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 1


def test_when_starting_and_one_step_fails_to_start_while_another_was_already_started(
    run, cluster, script
):
    real = cluster.start_steps

    async def partly(job_key, job_id, job_type, starts, sticky, step_types=None):
        answer = await real(
            job_key, job_id, job_type, [s for s in starts if s.step_id != bad], sticky
        )
        answer.results.append(StartResult(bad, StartOutcome.FAILED, StartJobStepError.UNKNOWN, "x"))
        return answer

    async def scenario():
        nonlocal bad
        script.plan_override = lambda job, r: [
            job.create_step(KeyStep, KeyRequest(key=k), step_id=f"id-{k}") for k in ("a", "b")
        ]
        bad = "id-b"
        cluster.start_steps = partly
        result = await cluster.start(ScenarioJob, request())
        return result, await cluster.wait(result.job_id)

    from .fixtures import KeyRequest, KeyStep

    bad = ""
    result, state = run(scenario())
    assert result.error == StartJobError.FAILED_STARTING_SOME_JOB_STEPS
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.successful_steps, state.progress.failed_steps) == (1, 1)


@pytest.mark.parametrize("outcome", [StartOutcome.ALREADY_STARTED])
def test_when_starting_and_the_only_step_was_already_started_it_is_not_a_failure(
    run, cluster, script, outcome
):
    real = cluster.start_steps

    async def already(job_key, job_id, job_type, starts, sticky, step_types=None):
        answer = await real(job_key, job_id, job_type, starts, sticky)  # it really runs
        answer.results = [StartResult(s.step_id, outcome) for s in starts]
        return answer

    cluster.start_steps = already

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        return result, await cluster.wait(result.job_id)

    result, state = run(scenario())
    assert result.error is None
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY  # its later report still counts


def test_when_starting_and_the_only_step_had_already_completed(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.wait(result.job_id)
        # Dispatch the completed step again: the worker answers with its stored outcome.
        [step] = await cluster.storage().steps.get_for_job(result.job_id)
        return await cluster.worker.start_steps(
            cluster.manager().ctx.key, result.job_id, "scenario.job", [_start(step.id)]
        )

    [answer] = run(scenario())
    assert answer.outcome == StartOutcome.COMPLETED
    assert answer.report.status == JobStepStatus.COMPLETED_SUCCESSFULLY


def _start(step_id: str):
    from choreography_ray.engine.messages import StepStart

    return StepStart(step_id, 1)


def test_a_step_failure_completes_the_job_with_failures(run, cluster, script):
    script.behaviour["b"].fail = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a", "b"))
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.successful_steps, state.progress.failed_steps) == (1, 1)
    failed = run(
        cluster.storage().steps.get_for_job(state.id, [JobStepStatus.COMPLETED_WITH_FAILURE])
    )
    assert failed[0].error.messages == ["step b failed"]


def test_a_step_that_raises_fails_with_the_error_and_its_trace(run, cluster, script):
    script.behaviour["a"].raise_error = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.wait(result.job_id)
        return await cluster.storage().steps.get_for_job(result.job_id)

    [step] = run(scenario())
    assert step.status == JobStepStatus.COMPLETED_WITH_FAILURE
    assert step.error.messages == ["RuntimeError: step a broke"]
    assert "RuntimeError" in step.error.stack_trace


def test_a_step_result_reaches_the_hook_typed(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("abc"))
        await cluster.wait(result.job_id)

    run(scenario())
    [outcome] = script.outcomes
    assert outcome.succeeded and outcome.result.value == 3 and outcome.result.key == "abc"


def test_when_a_step_completes_and_the_step_is_no_longer_tracked_the_report_is_ignored(
    run, cluster, script
):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        state = await cluster.wait(result.job_id)
        activation = await cluster.manager().activate(result.job_id)
        report = script.outcomes[0]
        from choreography_ray.engine.messages import StepReport

        activation.deliver([StepReport(report.step_id, JobStepStatus.COMPLETED_SUCCESSFULLY, 1, 1)])
        await cluster.settle()
        return state, await cluster.manager().get(result.job_id)

    before, after = run(scenario())
    assert after.progress.successful_steps == before.progress.successful_steps == 1
    assert after.status == JobStatus.COMPLETED_SUCCESSFULLY


# -- completing ------------------------------------------------------------------------------


def test_when_completing_with_failures_and_the_job_keeps_failed_runs(run, cluster, script):
    script.behaviour["a"].fail = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert run(cluster.storage().steps.count_for_job(state.id)) == 1


def test_when_completing_with_failures_and_the_job_does_not_keep_failed_runs(run, cluster, script):
    script.behaviour["a"].fail = True

    async def scenario():
        result = await cluster.start(ClearingJob, request("a", "b"))
        return result, await cluster.wait(result.job_id)

    result, state = run(scenario())
    assert state is None
    assert run(cluster.storage().steps.count_for_job(result.job_id)) == 0


def test_a_job_that_completes_successfully_is_cleared_by_default(run, cluster, script):
    async def scenario():
        result = await cluster.start(ClearingJob, request("a"))
        return result, await cluster.wait(result.job_id)

    result, state = run(scenario())
    assert state is None
    assert run(cluster.storage().jobs.find(result.job_id)) is None
    assert run(cluster.storage().steps.count_for_job(result.job_id)) == 0


def test_on_all_steps_completed_raising_fails_the_job(run, cluster, script):
    script.fail_hooks.add("on_all_steps_completed")

    async def scenario():
        result = await cluster.start(ClearingJob, request("a"))
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.FAILED
    assert (
        "on_all_steps_completed failed on purpose" in state.status_changes[-1].exception_messages[0]
    )


# -- stop, resume and remove -------------------------------------------------------------------


def test_stopping_a_running_job_stops_its_steps_and_runs_on_stopped(run, cluster, script):
    for key in ("a", "b"):
        script.behaviour[key].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a", "b"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.STOPPED
    assert state.stop_finalized and state.progress.stopped_steps == 2
    assert script.hooks[-1] == "on_stopped"
    steps = run(cluster.storage().steps.get_for_job(state.id))
    assert {s.status for s in steps} == {JobStepStatus.STOPPED}
    assert all(s.error.cancelled for s in steps)


def test_stopping_a_completed_job_is_refused(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.wait(result.job_id)
        await cluster.manager().stop(result.job_id)

    with pytest.raises(StopJobFailed) as raised:
        run(scenario())
    assert raised.value.code == StopJobError.JOB_IS_COMPLETED


def test_a_stopped_job_resumes_under_a_new_generation_and_completes(run, cluster, script):
    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a", "b"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        await cluster.settle()
        script.behaviour["a"].block = False
        answer = await cluster.manager().resume(result.job_id)
        return answer, await cluster.wait(result.job_id)

    answer, state = run(scenario())
    assert answer == ResumeJobSuccess.SUCCESS
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.execution_generation == 2
    assert state.progress.successful_steps == 2 and state.progress.stopped_steps == 0
    assert script.ran("b") == 1  # completed steps never run again
    assert script.ran("a") == 2
    assert "on_before_resuming_job_steps" in script.hooks


def test_resuming_a_completed_job_answers_that_it_is_completed(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.wait(result.job_id)
        return await cluster.manager().resume(result.job_id)

    assert run(scenario()) == ResumeJobSuccess.JOB_IS_COMPLETED


def test_resuming_a_running_job_with_live_work_answers_already_running(run, cluster, script):
    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        return await cluster.manager().resume(result.job_id)

    assert run(scenario()) == ResumeJobSuccess.JOB_ALREADY_RUNNING


def test_removing_a_running_job_stops_its_steps_and_clears_it(run, cluster, script):
    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a", "b"))
        await cluster.settle()
        await cluster.manager().remove(result.job_id)
        return result, await cluster.wait(result.job_id)

    result, state = run(scenario())
    assert state is None
    assert run(cluster.storage().steps.count_for_job(result.job_id)) == 0
    assert "on_stopped" in script.hooks


def test_removing_a_completed_job_is_refused(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.wait(result.job_id)
        await cluster.manager().remove(result.job_id)

    with pytest.raises(RemoveJobFailed) as raised:
        run(scenario())
    assert raised.value.code == RemoveJobError.JOB_IS_COMPLETED


# -- when resuming (after a crash or a stop) ---------------------------------------------------


def test_when_resuming_a_step_that_was_running_at_the_crash_runs_again(run, cluster, script):
    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a", "b"))
        await cluster.settle()
        await cluster.crash()
        script.behaviour["a"].block = False
        answer = await cluster.manager().resume(result.job_id)
        return answer, await cluster.wait(result.job_id)

    answer, state = run(scenario())
    assert answer == ResumeJobSuccess.SUCCESS
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert script.ran("a") == 2 and script.ran("b") == 1
    assert state.execution_generation == 1  # recovery continues the execution


def test_when_resuming_and_a_step_fails_to_start_the_job_still_runs(run, cluster, script):
    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.crash()
        cluster.dispatch_fault = ConnectionError("no worker")
        await cluster.manager().resume(result.job_id)
        state = await cluster.manager().get(result.job_id)
        cluster.dispatch_fault = None
        script.behaviour["a"].block = False
        await cluster.advance(30)  # the watchdog retries the start
        return state, await cluster.wait(result.job_id)

    during, state = run(scenario())
    assert during.status == JobStatus.RUNNING
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


# The placement spec's moments when no worker takes a start: the moment decides, not the error.
UNDELIVERED = [
    pytest.param(NoEligibleJobWorker("no worker host qualifies"), id="no-eligible-worker"),
    pytest.param(ConnectionError("the worker host went away"), id="lost-connection"),
]


@pytest.mark.parametrize("options", [JobsOptions(max_parallel_steps=8, worker_wait_timeout=0)])
@pytest.mark.parametrize("error", UNDELIVERED)
def test_when_starting_and_no_worker_takes_the_start_the_steps_count_failed(
    run, cluster, script, error
):
    async def scenario():
        cluster.dispatch_fault = error
        result = await cluster.start(ScenarioJob, request("a", "b"))
        cluster.dispatch_fault = None
        state = await cluster.wait(result.job_id)
        return result, state, await cluster.storage().steps.get_for_job(result.job_id)

    result, state, steps = run(scenario())
    assert result.error == StartJobError.ALL_JOB_STEPS_FAILED_STARTING
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 2
    assert all(s.is_prepared and s.status == JobStepStatus.UNKNOWN for s in steps)  # never ran
    assert script.runs == []
    assert [o.error.messages for o in script.outcomes] == [[str(error)]] * 2  # with the reason


@pytest.mark.parametrize("error", UNDELIVERED)
def test_when_resuming_and_no_worker_takes_the_start_the_watchdog_sends_it_again(
    run, cluster, script, options, error
):
    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.crash()
        cluster.dispatch_fault = error
        answer = await cluster.manager().resume(result.job_id)
        await cluster.advance(options.job_watchdog_interval.total_seconds())  # still none
        during = await cluster.manager().get(result.job_id)
        cluster.dispatch_fault = None
        script.behaviour["a"].block = False
        await cluster.advance(options.job_watchdog_interval.total_seconds())
        return answer, during, await cluster.wait(result.job_id)

    answer, during, state = run(scenario())
    assert answer == ResumeJobSuccess.SUCCESS
    assert during.status == JobStatus.RUNNING and during.progress.failed_steps == 0
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_when_resuming_and_the_job_has_more_steps_than_the_start_limit(run, script):
    from choreography_ray.testing import InProcessCluster

    async def scenario():
        cluster = InProcessCluster(options=JobsOptions(max_concurrent_step_starts=1))
        await cluster.provider.initialize()
        try:
            import choreography_ray.engine.stages as job_module

            saved = job_module.DISPATCH_BATCH
            job_module.DISPATCH_BATCH = 4
            try:
                result = await cluster.start(ScenarioJob, request(*[f"k{n}" for n in range(10)]))
                state = await cluster.wait(result.job_id)
            finally:
                job_module.DISPATCH_BATCH = saved
            return cluster.start_batches, state
        finally:
            await cluster.close()

    batches, state = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert max(batches) <= 4 and sum(batches) == 10


def test_when_resuming_and_the_job_was_left_running_with_every_step_completed(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        # Lose the outcome's effect on the job: the step is done, the job still says Running.
        stored = await cluster.storage().jobs.get(result.job_id)
        await cluster.crash()
        stored.status = JobStatus.RUNNING
        stored.progress.successful_steps = 0
        stored.status_changes = stored.status_changes[:-1]
        await cluster.storage().jobs.save(stored)
        answer = await cluster.manager().resume(result.job_id)
        return answer, await cluster.wait(result.job_id)

    answer, state = run(scenario())
    assert answer == ResumeJobSuccess.JOB_IS_COMPLETED
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 1
    assert script.ran("a") == 1


def test_when_resuming_and_the_job_was_stopped_with_every_step_completed(run, cluster, script):
    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        await cluster.settle()
        # The stop raced a success: make the stored step a success.
        [step] = await cluster.storage().steps.get_for_job(result.job_id)
        step.status = JobStepStatus.COMPLETED_SUCCESSFULLY
        await cluster.storage().steps.save(step)
        answer = await cluster.manager().resume(result.job_id)
        return answer, await cluster.wait(result.job_id)

    answer, state = run(scenario())
    assert answer == ResumeJobSuccess.JOB_IS_COMPLETED
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_when_resuming_and_the_job_was_stopped_without_any_steps(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request())
        return result, await cluster.wait(result.job_id)

    result, state = run(scenario())
    assert result.error == StartJobError.NO_JOB_STEPS_TO_START
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_a_resume_hook_that_fails_puts_a_stopped_job_back_to_stopped(run, cluster, script):
    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        await cluster.settle()
        script.fail_hooks.add("on_before_resuming_job_steps")
        with pytest.raises(ResumeJobFailed):
            await cluster.manager().resume(result.job_id)
        await cluster.settle()
        return await cluster.manager().get(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.STOPPED
    assert state.execution_generation == 1
    assert script.hooks.count("on_stopped") == 2  # it can release what the hook began
    assert script.ran("a") == 1


def test_a_late_stop_report_of_an_earlier_execution_is_not_counted(run, cluster, script):
    from choreography_ray.engine.messages import StepReport

    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        await cluster.settle()
        await cluster.manager().resume(result.job_id)
        await cluster.settle()
        activation = cluster.manager().activation(result.job_id)
        [step] = await cluster.storage().steps.get_for_job(result.job_id)
        activation.deliver([StepReport(step.id, JobStepStatus.STOPPED, generation=1, attempt=1)])
        await cluster.settle()
        script.release("a")
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.stopped_steps == 0


def test_a_late_stop_report_of_an_earlier_execution_does_not_finish_a_later_stop(
    run, cluster, script, monkeypatch
):
    """Stopped again in its second execution, the job waits for that execution's step to
    stop: a stop the first execution reports late is not that step stopping."""
    from choreography_ray.engine.messages import StepReport, StopResult

    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        await cluster.settle()
        await cluster.manager().resume(result.job_id)  # the second execution runs `a` again
        await cluster.settle()
        [step] = await cluster.storage().steps.get_for_job(result.job_id)

        async def still_stopping(request):  # the worker is told; its run has not settled yet
            return StopResult(stopping=[step.id])

        monkeypatch.setattr(cluster, "stop_steps", still_stopping)
        await cluster.manager().stop(result.job_id)
        await cluster.settle()
        activation = cluster.manager().activation(result.job_id)
        activation.deliver([StepReport(step.id, JobStepStatus.STOPPED, generation=1, attempt=1)])
        await cluster.settle()
        late = await cluster.manager().get(result.job_id)
        activation.deliver([StepReport(step.id, JobStepStatus.STOPPED, generation=2, attempt=1)])
        await cluster.settle()
        return late, await cluster.manager().get(result.job_id)

    late, settled = run(scenario())
    assert late.status == JobStatus.STOPPED and late.execution_generation == 2
    assert (late.stop_finalized, late.progress.stopped_steps) == (False, 0)
    assert (settled.stop_finalized, settled.progress.stopped_steps) == (True, 1)


# -- retries and windows -----------------------------------------------------------------------


def test_a_failed_attempt_is_retried_with_backoff_until_it_succeeds(run, cluster, script):
    script.behaviour["a"].fail_times = 2

    async def scenario():
        result = await cluster.start(RetryingJob, request("a"))
        await cluster.settle()
        first = list(script.runs)
        await cluster.advance(1)  # first backoff: 1 s
        second = list(script.runs)
        await cluster.advance(1)  # second backoff is 2 s: not yet
        not_yet = list(script.runs)
        await cluster.advance(1)
        return first, second, not_yet, await cluster.wait(result.job_id)

    first, second, not_yet, state = run(scenario())
    assert first == [("a", 1)]
    assert second == [("a", 1), ("a", 2)]
    assert not_yet == second
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert script.runs == [("a", 1), ("a", 2), ("a", 3)]
    [step] = run(cluster.storage().steps.get_for_job(state.id))
    assert step.attempt == 3


def test_a_step_that_fails_every_attempt_counts_as_failed_once(run, cluster, script):
    script.behaviour["a"].fail = True

    async def scenario():
        result = await cluster.start(RetryingJob, request("a"))
        for _ in range(5):
            await cluster.advance(60)
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 1
    assert script.ran("a") == 3


@pytest.mark.parametrize("how", ["non_retryable", "should_retry_step"])
def test_a_failure_is_final_when_the_step_or_the_job_says_so(run, cluster, script, how):
    script.behaviour["a"].fail = True
    if how == "non_retryable":
        script.behaviour["a"].non_retryable = True
    else:
        script.retry = False

    async def scenario():
        result = await cluster.start(RetryingJob, request("a"))
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert script.ran("a") == 1


def test_a_window_keeps_at_most_that_many_steps_active(run, cluster, script):
    keys = [f"w{n}" for n in range(6)]
    for key in keys:
        script.behaviour[key].block = True

    async def scenario():
        result = await cluster.start(WindowJob, request(*keys))
        await cluster.settle()
        started = [k for k, _ in script.runs]
        script.release("w0")
        await cluster.settle()
        after_one = [k for k, _ in script.runs]
        script.release(*keys)
        return started, after_one, await cluster.wait(result.job_id)

    started, after_one, state = run(scenario())
    assert len(started) == 2
    assert len(after_one) == 3
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_resuming_rebuilds_the_window_from_storage(run, cluster, script):
    keys = [f"w{n}" for n in range(5)]
    for key in keys:
        script.behaviour[key].block = True

    async def scenario():
        result = await cluster.start(WindowJob, request(*keys))
        await cluster.settle()
        await cluster.crash()
        for key in keys:
            script.behaviour[key].block = False
        script.runs.clear()
        await cluster.manager().resume(result.job_id)
        await cluster.settle()
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert sorted(k for k, _ in script.runs) == keys


def test_a_missing_job_cannot_be_resumed_from_a_plan_it_never_saved(run, cluster, script):
    from choreography_ray.jobs import JobState

    async def scenario():
        state = JobState(
            id="no-plan",
            key=cluster.manager().ctx.key,
            type="scenario.job",
            status=JobStatus.PREPARING_JOB,
            created=cluster.clock.now(),
        )
        await cluster.storage().jobs.save(state)
        await cluster.manager().resume("no-plan")

    with pytest.raises(ResumeJobFailed) as raised:
        run(scenario())
    assert raised.value.code == CannotResumeJobError.MISSING_STEP_PLAN


class _HeldDispatch:
    """Holds the answers of start batches after the worker took them, until released."""

    def __init__(self, cluster: InProcessCluster) -> None:
        self.release = asyncio.Event()
        self.taken = asyncio.Event()
        real = cluster.start_steps

        async def start_steps(*args, **kwargs):
            answer = await real(*args, **kwargs)
            self.taken.set()
            await self.release.wait()
            return answer

        cluster.start_steps = start_steps


def test_outcomes_are_counted_while_the_dispatch_is_still_unanswered(run, cluster, script):
    held = _HeldDispatch(cluster)

    async def scenario():
        starting = asyncio.ensure_future(
            cluster.start(ScenarioJob, request("a", "b"), job_id="held")
        )
        await held.taken.wait()
        await cluster.settle()  # the steps run, their outcomes are written and reported
        counted = (await cluster.manager().get("held")).progress.successful_steps
        answered = starting.done()
        held.release.set()
        result = await starting
        return counted, answered, result, await cluster.wait("held")

    counted, answered, result, state = run(scenario())
    assert (counted, answered) == (2, False)
    assert result.error is None
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 2


def test_a_stop_while_the_dispatch_is_unanswered_stops_the_job_and_start_returns(
    run, cluster, script
):
    held = _HeldDispatch(cluster)
    script.behaviour["a"].block = True

    async def scenario():
        starting = asyncio.ensure_future(cluster.start(ScenarioJob, request("a"), job_id="held"))
        await held.taken.wait()
        stopping = asyncio.ensure_future(cluster.manager().stop("held"))
        await cluster.settle()
        stopped_first = stopping.done()
        held.release.set()
        result = await starting
        await stopping
        return stopped_first, result, await cluster.wait("held")

    stopped_first, result, state = run(scenario())
    assert stopped_first  # the stop did not wait for the dispatch's answer
    assert result.error is None
    assert state.status == JobStatus.STOPPED
    assert state.stop_finalized
    assert state.progress.stopped_steps == 1
