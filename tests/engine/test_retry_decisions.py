"""One decision per failed attempt: made once, stored with the outcome, and the same live, on
resume, in the worker and in the recount; the retry policy that decides it."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from choreography_ray.engine.clock import settle
from choreography_ray.engine.messages import (
    StartOutcome,
    StepReport,
    StepStart,
    pack_reports,
    unpack_reports,
)
from choreography_ray.engine.stored_steps import settled
from choreography_ray.jobs import (
    InvalidOptionError,
    JobsOptions,
    JobStatus,
    JobStepStatus,
    RetryPolicy,
)
from choreography_ray.jobs.state import JobStepState, StepDecision, StepError
from choreography_ray.jobs.step import StepContext, StepFailed
from choreography_ray.testing import InProcessCluster

from . import fixtures
from .fixtures import (
    KeyRequest,
    KeyResult,
    KeyState,
    KeyStep,
    RetryingJob,
    ScenarioJob,
    held_steps,
    request,
)


def test_a_resumed_job_waits_out_the_stored_failure_s_backoff(run, cluster, script):
    """A failed attempt whose retry was due in 1 s when the controller crashed is tried
    again 1 s after it failed, not at once when the job is recovered."""
    script.behaviour["a"].fail_times = 1

    async def scenario():
        result = await cluster.start(RetryingJob, request("a"))
        await cluster.settle()
        await cluster.crash()
        await cluster.manager().resume(result.job_id)
        await cluster.settle()
        at_once = list(script.runs)
        await cluster.advance(1)
        return at_once, await cluster.wait(result.job_id)

    at_once, state = run(scenario())
    assert at_once == [("a", 1)]
    assert script.runs == [("a", 1), ("a", 2)]
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_a_recovery_keeps_the_live_decision_to_retry_whatever_the_hook_says_later(
    run, cluster, script
):
    """The job's `should_retry_step` said retry; after a crash it would say no. The stored
    decision stands: the step is tried again, as the live run decided."""
    script.behaviour["a"].fail_times = 1

    async def scenario():
        result = await cluster.start(RetryingJob, request("a"))
        await cluster.settle()
        [stored] = await cluster.storage().steps.get_for_job(result.job_id)
        await cluster.crash()
        script.retry = False
        await cluster.manager().resume(result.job_id)
        await cluster.advance(1)
        return stored, await cluster.wait(result.job_id)

    stored, state = run(scenario())
    assert stored.decision is not None and stored.decision.retry
    assert (stored.decision.attempt, stored.decision.retry_at) == (
        1,
        stored.status_changes[-1].occurred + timedelta(seconds=1),
    )
    assert script.runs == [("a", 1), ("a", 2)]
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_a_recovery_keeps_the_live_decision_that_a_failure_is_final(run, cluster, script):
    """The hook said no retry; after a crash it would say yes. The failure stays final."""
    script.behaviour["a"].fail = True
    script.behaviour["b"].block = True
    script.retry = False

    async def scenario():
        result = await cluster.start(RetryingJob, request("a", "b"))
        await cluster.settle()
        await cluster.crash()
        script.retry = True
        script.behaviour["b"].block = False
        await cluster.manager().resume(result.job_id)
        await cluster.advance(60)
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert script.ran("a") == 1
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 1


def test_a_worker_answers_a_late_retry_start_of_a_failure_decided_final_with_its_outcome():

    failed = JobStepState(
        id="s",
        job_id="j",
        type="t",
        status=JobStepStatus.COMPLETED_WITH_FAILURE,
        attempt=1,
        error=StepError(messages=["no"]),
    )
    retry_start = StepStart("s", generation=0, attempt=2)
    assert settled(retry_start, failed) is None  # undecided: the job's later start is its retry
    final = failed.model_copy(update={"decision": StepDecision(attempt=1, retry=False)})
    answer = settled(retry_start, final)
    assert answer is not None and answer.outcome == StartOutcome.COMPLETED
    assert answer.report is not None and answer.report.decision == final.decision
    again = failed.model_copy(update={"decision": StepDecision(attempt=1, retry=True)})
    assert settled(retry_start, again) is None
    assert settled(StepStart("s", generation=0, attempt=1), again) is not None  # a resend


class WindowedRetryingJob(RetryingJob, name="tests.decisions.windowed-retrying-job"):
    max_active_steps = 2


async def _until(condition: Callable[[], Any], turns: int = 2000) -> None:
    """Run the loop until `condition()` (awaited when it is a coroutine) holds."""
    for _ in range(turns):
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        await asyncio.sleep(0)
    raise AssertionError("the scenario did not reach its next point")


def test_a_retry_is_sent_only_once_its_decision_is_stored(run, script):
    """The turn that hears a failure schedules its retry, then dispatches other steps and
    waits for the workers' answers outside the job's turn; the retry can go out meanwhile.
    The decision must already be stored by then: stored later, it lands between the worker's
    read of the record and the retry's Running write, which then finds the record changed
    under its run; the run stops, reports nothing, and the job waits for its watchdog (the
    90 s of benchmarks/adaptive.py with a fixed window)."""
    script.behaviour["a"].fail_times = 1
    held, wrap = held_steps(  # the write of a's second attempt (its Running) waits
        lambda states: any(state.name == "a" and state.attempt == 2 for state in states)
    )
    cluster = InProcessCluster(options=JobsOptions(max_parallel_steps=8), wrap_storage=wrap)
    dispatch = cluster.start_steps
    c_sent, c_go = asyncio.Event(), asyncio.Event()

    async def start_steps(job_key, job_id, job_type, starts, *args: Any, **kwargs: Any) -> Any:
        steps = await cluster.storage(job_key).steps.get_many(job_id, [s.step_id for s in starts])
        if any(step.name == "c" for step in steps):
            c_sent.set()  # the turn that heard a's failure waits here, outside the turn
            await c_go.wait()
        return await dispatch(job_key, job_id, job_type, starts, *args, **kwargs)

    cluster.start_steps = start_steps  # type: ignore[method-assign]

    async def stored(job_id: str) -> JobStepState:
        steps = await cluster.storage().steps.get_for_job(job_id)
        return next(step for step in steps if step.name == "a")

    async def decided(job_id: str) -> bool:
        return (await stored(job_id)).decision is not None

    async def scenario():
        async with cluster:
            job_id = (await cluster.start(WindowedRetryingJob, request("a", "b", "c"))).job_id
            await _until(c_sent.is_set)  # a failed and b succeeded: the window sends c
            failed = await stored(job_id)
            assert (failed.status, failed.attempt) == (JobStepStatus.COMPLETED_WITH_FAILURE, 1)
            await cluster.clock.advance(1)  # a's retry is due while that turn waits
            await _until(lambda: held[0].waiting)  # the worker read a's record to retry it
            c_go.set()  # the turn goes on, and stores what it has not stored yet
            await _until(lambda: decided(job_id))
            await settle()
            held[0].go.set()  # the retry's Running write
            return await cluster.wait(job_id)

    state = run(scenario())
    assert state is not None
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY  # without waiting for the watchdog
    assert sorted(script.runs) == [("a", 1), ("a", 2), ("b", 1), ("c", 1)]


# -- the policy -----------------------------------------------------------------------------------


class PatientJob(ScenarioJob, name="tests.decisions.patient-job"):
    retry_policy = RetryPolicy(initial_interval=timedelta(seconds=5), maximum_attempts=2)


class StubbornStep(KeyStep, name="tests.decisions.stubborn-step"):
    retry_policy = RetryPolicy(
        initial_interval=timedelta(seconds=2),
        maximum_attempts=3,
        non_retryable_error_types=(PermissionError,),
    )

    async def perform(self, state: KeyState, ctx: StepContext) -> KeyResult:
        fixtures.SCRIPT.runs.append((state.key, ctx.attempt))
        if state.key.startswith("denied"):
            raise PermissionError("denied")
        if state.key.startswith("later") and ctx.attempt == 1:
            raise StepFailed("come back later", retry_after=timedelta(seconds=7))
        if ctx.attempt == 1:
            raise ValueError("flaky")
        return KeyResult(key=state.key)


class StubbornJob(ScenarioJob, name="tests.decisions.stubborn-job"):
    """One attempt by the options; its steps' class allows three."""

    def prepare_steps(self, request: Any) -> list[Any]:
        return [self.create_step(StubbornStep, KeyRequest(key=key)) for key in request.keys]


def _runs_at(script, cluster, job_type, keys, times):
    async def scenario():
        result = await cluster.start(job_type, request(*keys))
        await cluster.settle()
        seen = [list(script.runs)]
        for seconds in times:
            await cluster.advance(seconds)
            seen.append(list(script.runs))
        return seen, await cluster.wait(result.job_id)

    return scenario()


def test_the_job_class_policy_replaces_the_options(run, cluster, script):
    script.behaviour["a"].fail_times = 1
    seen, state = run(_runs_at(script, cluster, PatientJob, ["a"], [4, 1]))
    assert seen == [[("a", 1)], [("a", 1)], [("a", 1), ("a", 2)]]  # 5 s, not the options' 1 s
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_the_step_class_policy_wins_over_the_job_s_and_names_what_is_never_retried(
    run, cluster, script
):
    seen, state = run(_runs_at(script, cluster, StubbornJob, ["flaky", "denied"], [1, 1]))
    assert seen[1] == [("flaky", 1), ("denied", 1)]  # the step's 2 s, not the options' 1 s
    assert seen[2] == [("flaky", 1), ("denied", 1), ("flaky", 2)]
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 1  # PermissionError: never retried
    steps = {s.name or s.id: s for s in run(cluster.storage().steps.get_for_job(state.id))}
    errors = [s.error for s in steps.values() if s.error is not None]
    assert [e.error_type for e in errors] == ["PermissionError"]


def test_the_error_s_retry_after_wins_over_the_policy_s_backoff(run, cluster, script):
    seen, state = run(_runs_at(script, cluster, StubbornJob, ["later"], [6, 1]))
    assert seen == [[("later", 1)], [("later", 1)], [("later", 1), ("later", 2)]]
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_a_class_s_retry_policy_must_be_a_retry_policy():

    try:

        class Wrong(ScenarioJob, name="tests.decisions.wrong-job"):
            retry_policy = 3  # type: ignore[assignment]

    except InvalidOptionError as error:
        assert error.setting.endswith("Wrong.retry_policy")
        assert "expected a RetryPolicy" in str(error)
    else:
        raise AssertionError("a retry policy that is not one was accepted")


def test_retry_after_must_be_a_duration():

    try:
        StepFailed("x", retry_after="soon")  # type: ignore[arg-type]
    except InvalidOptionError as error:
        assert error.setting == "StepFailed.retry_after"
    else:
        raise AssertionError("a retry_after that is no duration was accepted")
    assert StepFailed("x", retry_after=timedelta(seconds=3)).retry_after == 3.0


# -- records and messages -------------------------------------------------------------------------


def test_a_record_of_an_earlier_release_reads_without_a_decision():

    old = JobStepState.model_validate_json(
        '{"id": "s", "job_id": "j", "type": "t", "status": 7, "attempt": 2,'
        ' "error": {"messages": ["no"], "non_retryable": false}}'
    )
    assert old.decision is None and old.error is not None and old.error.error_type == ""


def test_a_decision_crosses_hosts_and_an_older_host_s_flag_is_no_decision():

    decided = StepReport(
        "s",
        JobStepStatus.COMPLETED_WITH_FAILURE,
        1,
        2,
        error=StepError(messages=["no"], non_retryable=True),
        decision=StepDecision(attempt=2, retry=False),
    )
    fresh = decided._replace(decision=None)
    assert unpack_reports(pack_reports([decided, fresh])) == [decided, fresh]
    assert pack_reports([fresh])[0][-1] is True  # what an older release reads there
    older = (*pack_reports([fresh])[0][:-1], True)
    [read] = unpack_reports([older])
    assert read.decision is None and read.error is not None and read.error.non_retryable


def test_a_failure_told_again_while_its_retry_runs_is_not_decided_again(run, cluster, script):
    """A report delivered again after its answer was lost (the outbox retries a delivery)
    finds its attempt decided and its retry running. Decided again, it would drop the retry's
    tracking, schedule another retry and store a decision under the retry's run, whose outcome
    write then finds the record changed: the run stops, reports nothing, and the job waits for
    its watchdog."""
    script.behaviour["a"].fail_times = 1
    deliver = cluster.report
    failures: list[tuple[Any, list[StepReport]]] = []

    async def keeping(job_key, job_id, reports):
        failed = [r for r in reports if r.status == JobStepStatus.COMPLETED_WITH_FAILURE]
        if failed:
            failures.append((job_key, failed))
        await deliver(job_key, job_id, reports)

    cluster.report = keeping

    async def scenario():
        job_id = (await cluster.start(RetryingJob, request("a"))).job_id
        await cluster.settle()
        assert script.runs == [("a", 1)] and len(failures) == 1
        script.behaviour["a"].block = True  # the retry performs until released
        await cluster.advance(1)
        await _until(lambda: script.runs == [("a", 1), ("a", 2)])
        job_key, failed = failures[0]
        activation = cluster.manager().activation(job_id)
        assert activation is not None
        ignored = activation.counters.ignored_reports
        await deliver(job_key, job_id, failed)  # the same failure, told again
        await cluster.settle()
        assert activation.counters.ignored_reports == ignored + 1  # not decided again
        script.release("a")
        await cluster.settle()
        return await cluster.wait(job_id)

    state = run(scenario())
    assert state is not None
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY  # without waiting for the watchdog
    assert script.runs == [("a", 1), ("a", 2)]


def test_a_failure_told_again_during_its_backoff_is_not_decided_again(run, cluster, script):
    """The same, told again while the retry waits out its backoff (no run to track yet)."""
    script.behaviour["a"].fail_times = 1
    deliver = cluster.report

    async def twice(job_key, job_id, reports):
        await deliver(job_key, job_id, reports)
        failed = [r for r in reports if r.status == JobStepStatus.COMPLETED_WITH_FAILURE]
        if failed:
            await deliver(job_key, job_id, failed)  # a delivery retried after its answer was lost

    cluster.report = twice

    async def scenario():
        job_id = (await cluster.start(RetryingJob, request("a"))).job_id
        await cluster.settle()
        activation = cluster.manager().activation(job_id)
        assert activation is not None
        ignored = activation.counters.ignored_reports
        await cluster.advance(1)
        return ignored, await cluster.wait(job_id)

    ignored, state = run(scenario())
    assert ignored == 1  # the second telling, before the retry went
    assert state is not None and state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert script.runs == [("a", 1), ("a", 2)]


def test_a_retried_step_s_running_record_holds_no_earlier_error_or_decision(run, cluster, script):
    """While attempt 2 runs, its stored record says Running with no error and no decision:
    the first attempt's failure and the decision on it belong to that attempt's outcome."""
    script.behaviour["a"].fail_times = 1

    async def scenario():
        result = await cluster.start(RetryingJob, request("a"))
        await cluster.settle()
        [failed] = await cluster.storage().steps.get_for_job(result.job_id)
        script.behaviour["a"].block = True  # attempt 2 waits, Running, for the test to look
        await cluster.advance(1)
        await cluster.settle()
        [running] = await cluster.storage().steps.get_for_job(result.job_id)
        script.release("a")
        return failed, running, await cluster.wait(result.job_id)

    failed, running, state = run(scenario())
    assert failed.status == JobStepStatus.COMPLETED_WITH_FAILURE
    assert failed.error is not None and failed.decision is not None
    assert (running.status, running.attempt) == (JobStepStatus.RUNNING, 2)
    assert running.error is None and running.decision is None
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
