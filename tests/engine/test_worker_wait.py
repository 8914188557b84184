"""A starting job that no worker host qualifies for waits, durably and visibly, for up to
`worker_wait_timeout`, and its steps start when one appears; once the wait is over they count
failed with the reason, as with `worker_wait_timeout=0` at once (the reference behaviour)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from choreography_ray.jobs import JobsOptions, JobStatus, StartJobError
from choreography_ray.jobs.errors import NoEligibleJobWorker

from .fixtures import ScenarioJob, WindowJob, request

WATCHDOG = 30
NONE_QUALIFIES = NoEligibleJobWorker("no worker host runs job type 'scenario'")


@pytest.fixture
def options() -> JobsOptions:
    return JobsOptions(
        max_parallel_steps=8, worker_wait_timeout="5m", job_watchdog_interval=WATCHDOG
    )


def test_a_starting_job_waits_visibly_and_its_steps_start_when_a_worker_appears(
    run, cluster, script
):
    async def scenario():
        cluster.dispatch_fault = NONE_QUALIFIES
        result = await cluster.start(ScenarioJob, request("a", "b"))
        await cluster.advance(WATCHDOG)  # still none: it goes on waiting
        stored = await cluster.storage().jobs.get(result.job_id)
        cluster.dispatch_fault = None  # a worker node joins
        await cluster.advance(WATCHDOG)
        return result, stored, await cluster.wait(result.job_id)

    result, waiting, state = run(scenario())
    assert result.succeeded
    assert waiting.status == JobStatus.RUNNING and waiting.progress.failed_steps == 0
    assert waiting.waiting_for_worker is not None
    assert waiting.waiting_for_worker.reason == str(NONE_QUALIFIES)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.waiting_for_worker is None
    assert sorted(step for step, _ in script.runs) == ["a", "b"]


def test_once_the_wait_is_over_the_steps_count_failed_with_the_reason(run, cluster, script):
    async def scenario():
        cluster.dispatch_fault = NONE_QUALIFIES
        result = await cluster.start(ScenarioJob, request("a", "b"))
        stored = await cluster.storage().jobs.get(result.job_id)
        for _ in range(5 * 60 // WATCHDOG + 1):
            await cluster.advance(WATCHDOG)
        return stored, await cluster.wait(result.job_id)

    waiting, state = run(scenario())
    since = waiting.waiting_for_worker.since
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 2
    assert state.waiting_for_worker is None
    assert state.status_changes[-1].occurred - since >= timedelta(minutes=5)
    assert [o.error.messages for o in script.outcomes] == [[str(NONE_QUALIFIES)]] * 2
    assert script.runs == []


@pytest.mark.parametrize("options", [JobsOptions(max_parallel_steps=8, worker_wait_timeout=0)])
def test_a_zero_wait_fails_the_steps_at_once_as_the_reference_system_does(run, cluster, script):
    async def scenario():
        cluster.dispatch_fault = NONE_QUALIFIES
        result = await cluster.start(ScenarioJob, request("a"))
        return result, await cluster.wait(result.job_id)

    result, state = run(scenario())
    assert result.error == StartJobError.ALL_JOB_STEPS_FAILED_STARTING
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.waiting_for_worker is None


def test_a_lost_connection_is_not_a_reason_to_wait(run, cluster, script):
    async def scenario():
        cluster.dispatch_fault = ConnectionError("the worker host went away")
        result = await cluster.start(ScenarioJob, request("a"))
        return result, await cluster.wait(result.job_id)

    result, state = run(scenario())
    assert result.error == StartJobError.ALL_JOB_STEPS_FAILED_STARTING
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES


def test_the_wait_outlives_the_controller_and_its_deadline_still_holds(run, cluster, script):
    async def scenario():
        cluster.dispatch_fault = NONE_QUALIFIES
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.advance(WATCHDOG)
        await cluster.crash()
        await cluster.manager().resume(result.job_id)
        resumed = await cluster.storage().jobs.get(result.job_id)
        for _ in range(5 * 60 // WATCHDOG + 1):
            await cluster.advance(WATCHDOG)
        return resumed, await cluster.wait(result.job_id)

    resumed, state = run(scenario())
    assert resumed.status == JobStatus.RUNNING and resumed.waiting_for_worker is not None
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 1


# -- the reference system's moments, with worker_wait_timeout=0 ------------------------------

SEED = JobsOptions(max_parallel_steps=8, worker_wait_timeout=0)


@pytest.mark.parametrize("options", [SEED])
def test_moment_one_no_worker_as_steps_are_prepared_fails_the_job_with_the_reason(
    run, cluster, script
):
    async def scenario():
        cluster.placement_fault = NONE_QUALIFIES
        result = await cluster.start(ScenarioJob, request("a", "b"))
        cluster.placement_fault = None
        await cluster.advance(WATCHDOG)  # nothing is retried
        state = await cluster.storage().jobs.get(result.job_id)
        return result, state, await cluster.storage().steps.get_for_job(result.job_id)

    result, state, steps = run(scenario())
    assert result.error == StartJobError.UNKNOWN
    assert state.status == JobStatus.FAILED
    assert state.status_changes[-1].exception_messages == [f"NoEligibleJobWorker: {NONE_QUALIFIES}"]
    assert steps == [] and script.runs == []


def test_while_waiting_is_allowed_no_worker_at_preparation_does_not_fail_the_job(
    run, cluster, script
):
    async def scenario():
        cluster.placement_fault = NONE_QUALIFIES
        cluster.dispatch_fault = NONE_QUALIFIES
        result = await cluster.start(ScenarioJob, request("a"))
        state = await cluster.storage().jobs.get(result.job_id)
        cluster.placement_fault = cluster.dispatch_fault = None
        await cluster.advance(WATCHDOG)
        return result, state, await cluster.wait(result.job_id)

    result, waiting, state = run(scenario())
    assert result.succeeded and waiting.waiting_for_worker is not None
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


# -- steps of several types: some find a worker, others none -----------------------------------


def no_worker_for_b(cluster) -> None:
    """No worker takes step b (none runs its type); the others start as usual."""
    real = cluster.start_steps

    async def without_b(job_key, job_id, job_type, starts, sticky, step_types=None):
        states = await cluster.storage().steps.get_many(job_id, [s.step_id for s in starts])
        nowhere = {s.id for s in states if s.name == "b"}
        answer = await real(
            job_key, job_id, job_type, [s for s in starts if s.step_id not in nowhere], sticky
        )
        answer.undelivered = [s for s in starts if s.step_id in nowhere]
        answer.error = NONE_QUALIFIES if answer.undelivered else None
        return answer

    cluster.start_steps = without_b


def test_while_some_steps_find_no_worker_the_job_goes_on_waiting_its_deadline_unchanged(
    run, cluster, script
):
    """A job whose steps are of several types may have workers for some and none for others:
    the steps that started do not end the wait of the others."""
    script.behaviour["a"].block = True

    async def scenario():
        no_worker_for_b(cluster)
        # a window of two: a and b go first, then c, which a worker takes
        result = await cluster.start(WindowJob, request("a", "b", "c"))
        await cluster.settle()
        waiting = await cluster.manager().get(result.job_id)
        script.release("a")
        for _ in range(5 * 60 // WATCHDOG + 1):
            await cluster.advance(WATCHDOG)
        return result, waiting, await cluster.wait(result.job_id)

    result, waiting, state = run(scenario())
    assert result.succeeded
    assert sorted(step for step, _ in script.runs) == ["a", "c"]
    assert waiting.waiting_for_worker is not None
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 1
    assert state.status_changes[-1].occurred - waiting.waiting_for_worker.since >= timedelta(
        minutes=5
    )
    assert [o.error.messages for o in script.outcomes if o.error] == [[str(NONE_QUALIFIES)]]


def test_a_recovered_job_whose_batch_finds_workers_for_some_steps_keeps_its_deadline(
    run, cluster, script
):
    script.behaviour["a"].block = True

    async def scenario():
        no_worker_for_b(cluster)
        result = await cluster.start(ScenarioJob, request("a", "b"))
        before = await cluster.storage().jobs.get(result.job_id)
        await cluster.advance(WATCHDOG)
        await cluster.crash()
        await cluster.manager().resume(result.job_id)  # a and b go again, in one batch
        await cluster.settle()
        resumed = await cluster.manager().get(result.job_id)
        script.release("a")
        return before, resumed

    before, resumed = run(scenario())
    assert script.ran("a") == 2 and script.ran("b") == 0
    assert resumed.waiting_for_worker is not None
    assert resumed.waiting_for_worker.since == before.waiting_for_worker.since
