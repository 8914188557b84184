"""A worker host lost while its job runs or stops: its starts go again, each outcome counts
once, a step whose outcome is stored never runs again, and a live run is never doubled."""

from __future__ import annotations

import asyncio

from choreography_ray.engine.messages import StartOutcome, StepStart
from choreography_ray.jobs import JobsOptions
from choreography_ray.jobs.status import JobStatus, JobStepStatus
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, request


def _cluster(options: JobsOptions, workers: int = 2) -> InProcessCluster:
    return InProcessCluster(options=options, workers=workers)


async def _blocked(cluster: InProcessCluster, script, keys: str, job=ScenarioJob) -> str:
    """Start a job whose steps (one per key) block until released; settled."""
    for key in keys:
        script.behaviour[key].block = True
    result = await cluster.start(job, request(*keys))
    await cluster.settle()
    return result.job_id


def _placed(cluster: InProcessCluster, job_id: str) -> dict[str, str]:
    """Which worker host holds a run of which step."""
    return {
        run.step_id: host
        for host, worker in cluster.workers.items()
        for run in worker.runs_of(job_id)
    }


def _lose_controllers(cluster: InProcessCluster) -> None:
    """The controllers are lost, the workers live: the next call activates jobs afresh."""
    for manager in cluster.managers.values():
        manager.close()
    cluster.managers.clear()


async def _keys_on(cluster: InProcessCluster, host: str, job_id: str) -> set[str]:
    """The keys of the steps whose runs are on `host`."""
    ids = {run.step_id for run in cluster.workers[host].runs_of(job_id)}
    steps = await cluster.storage().steps.get_many(job_id, sorted(ids))
    return {step.name for step in steps}


def test_a_lost_worker_hosts_steps_run_again_on_another_and_count_once(run, script, options):
    cluster = _cluster(options)

    async def scenario():
        async with cluster:
            job_id = await _blocked(cluster, script, "abcd")
            lost = await _keys_on(cluster, "worker-1", job_id)
            kept = await _keys_on(cluster, "worker-0", job_id)
            assert lost and kept and lost | kept == set("abcd")
            await cluster.lose_worker("worker-1")
            await cluster.settle()
            assert await _keys_on(cluster, "worker-0", job_id) == set("abcd")
            script.release(*"abcd")
            state = await cluster.wait(job_id)
            steps = await cluster.storage().steps.get_for_job(job_id)
            return lost, kept, state, steps

    lost, kept, state, steps = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 4
    assert {step.status for step in steps} == {JobStepStatus.COMPLETED_SUCCESSFULLY}
    assert all(script.ran(key) == 2 for key in lost)  # interrupted: run again
    assert all(script.ran(key) == 1 for key in kept)
    assert [a for _, a in script.runs] == [1] * len(script.runs)  # same attempt: not a failure


def test_a_step_whose_outcome_is_stored_is_counted_from_storage_not_run_again(run, script, options):
    cluster = _cluster(options)

    async def scenario():
        async with cluster:
            real = cluster.report
            cluster.report = _dropped  # the report is lost with its host
            result = await cluster.start(ScenarioJob, request("a"))  # round robin: worker-0
            await cluster.settle()
            [step] = await cluster.storage().steps.get_for_job(result.job_id)
            assert step.status == JobStepStatus.COMPLETED_SUCCESSFULLY
            assert (await cluster.manager().get(result.job_id)).status == JobStatus.RUNNING
            cluster.report = real
            await cluster.lose_worker("worker-0")
            return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 1
    assert script.ran("a") == 1
    assert cluster.sent[-1][0] == "worker-1"


def test_a_start_answered_after_its_host_was_lost_goes_again(run, script, options):
    cluster = _cluster(options)
    held = asyncio.Event()
    taken = asyncio.Event()
    real = cluster.start_steps

    async def holding(*args):
        answer = await real(*args)
        if not taken.is_set():
            taken.set()
            await held.wait()
        return answer

    cluster.start_steps = holding

    async def scenario():
        async with cluster:
            for key in "ab":
                script.behaviour[key].block = True
            starting = asyncio.ensure_future(cluster.start(ScenarioJob, request("a", "b")))
            await taken.wait()
            await cluster.settle()
            lost = await _keys_on(cluster, "worker-1", starting_id(cluster))
            await cluster.lose_worker("worker-1")  # the job hears of it before the answer
            held.set()
            result = await starting
            await cluster.settle()
            script.release("a", "b")
            return lost, await cluster.wait(result.job_id)

    lost, state = run(scenario())
    assert lost
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 2
    assert all(script.ran(key) == 2 for key in lost)


def starting_id(cluster: InProcessCluster) -> str:
    [job_id] = cluster.manager().active_jobs
    return job_id


def test_a_resumed_job_sends_a_running_step_back_to_the_host_that_runs_it(run, script, options):
    cluster = _cluster(options)

    async def scenario():
        async with cluster:
            job_id = await _blocked(cluster, script, "ab")
            placed = _placed(cluster, job_id)
            _lose_controllers(cluster)
            cluster._turn = 1  # round robin alone would now send each step to the other host
            sent = len(cluster.sent)
            await (await cluster.manager().rehydrate())
            await cluster.settle()
            resent = cluster.sent[sent:]
            script.release("a", "b")
            return placed, resent, await cluster.wait(job_id)

    placed, resent, state = run(scenario())
    steps_on = {step: host for host, step in resent}
    assert len(steps_on) == 2
    assert script.ran("a") == 1 and script.ran("b") == 1  # never doubled
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 2
    assert sorted(placed.values()) == ["worker-0", "worker-1"]
    assert steps_on == placed  # each went back to the host that runs it


def test_a_worker_refuses_a_step_that_another_live_host_runs(run, script, options):
    cluster = _cluster(options)

    async def scenario():
        async with cluster:
            script.behaviour["a"].block = True
            result = await cluster.start(ScenarioJob, request("a"))  # worker-0 runs it
            await cluster.settle()
            [step] = await cluster.storage().steps.get_for_job(result.job_id)
            assert step.lease is not None and step.lease.host == "worker-0"
            key = cluster.manager().ctx.key
            other = cluster.workers["worker-1"]
            [refused] = await other.start_steps(
                key, result.job_id, "scenario.job", [StepStart(step.id, 0)]
            )
            await cluster.lose_worker("worker-0", tell=False)
            [started] = await other.start_steps(
                key, result.job_id, "scenario.job", [StepStart(step.id, 0)]
            )
            await cluster.settle()
            return refused, started

    refused, started = run(scenario())
    assert refused.outcome == StartOutcome.RUNNING_ELSEWHERE and refused.reason == "worker-0"
    assert started.outcome == StartOutcome.STARTED  # its host is gone: it runs here now
    assert script.ran("a") == 2


def test_a_stop_finishes_when_a_host_that_was_stopping_steps_is_lost(run, script, options):
    cluster = _cluster(options)

    async def scenario():
        async with cluster:
            job_id = await _blocked(cluster, script, "ab")
            [doomed] = cluster.workers["worker-1"].runs_of(job_id)
            real = cluster.report

            async def losing(job_key, job_id, reports):
                # The stop report of the step on worker-1 dies with its host.
                kept = [r for r in reports if r.step_id != doomed.step_id]
                if kept:
                    await real(job_key, job_id, kept)

            cluster.report = losing
            await cluster.manager().stop(job_id)
            await cluster.settle()
            assert "on_stopped" not in script.hooks  # one step has not reported its stop
            await cluster.lose_worker("worker-1")
            return await cluster.wait(job_id)

    state = run(scenario())
    assert state.status == JobStatus.STOPPED and state.stop_finalized
    assert state.progress.stopped_steps == 2
    assert script.hooks.count("on_stopped") == 1


async def _dropped(job_key, job_id, reports) -> None:
    """A report that never arrives."""


def test_a_new_activation_sends_queued_runs_back_to_the_host_that_holds_them(run, script):
    cluster = InProcessCluster(options=JobsOptions(max_parallel_steps=1), workers=2)

    async def scenario():
        async with cluster:
            job_id = await _blocked(cluster, script, "abcd")  # each host performs one, queues one
            held = _placed(cluster, job_id)
            _lose_controllers(cluster)
            cluster._turn = 1  # round robin alone would send each step to the other host
            sent = len(cluster.sent)
            await (await cluster.manager().rehydrate())
            await cluster.settle()
            resent = dict((step, host) for host, step in cluster.sent[sent:])
            script.release(*"abcd")
            return held, resent, await cluster.wait(job_id)

    held, resent, state = run(scenario())
    assert len(held) == 4 and resent == held
    assert all(script.ran(key) == 1 for key in "abcd")
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
