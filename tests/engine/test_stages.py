"""Stages (reference §h for_Job/when_running_in_stages, Stages/for_JobStages, for_JobProgress)."""

from __future__ import annotations

from choreography_ray.engine import progress as counting
from choreography_ray.jobs import JobStageProgress, JobStatus, JobStepStatus

from .fixtures import ScenarioJob, request

THREE_STAGES = {"a1": 1, "a2": 1, "b1": 2, "b2": 2, "c1": 3, "c2": 3}


def a_job_with_three_stages():
    return request(*THREE_STAGES, stages=THREE_STAGES)


def _stages(state):
    return {e.stage: e for e in state.progress.stages}


def test_and_the_job_starts_only_stage_one_is_started(run, cluster, script):
    for key in THREE_STAGES:
        script.behaviour[key].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, a_job_with_three_stages())
        await cluster.settle()
        return await cluster.manager().get(result.job_id)

    state = run(scenario())
    assert sorted(k for k, _ in script.runs) == ["a1", "a2"]
    stages = _stages(state)
    assert stages[1].is_started and not stages[2].is_started and not stages[3].is_started


def test_and_the_first_stage_succeeds_stage_two_starts(run, cluster, script):
    for key in ("b1", "b2", "c1", "c2"):
        script.behaviour[key].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, a_job_with_three_stages())
        await cluster.settle()
        return await cluster.manager().get(result.job_id)

    state = run(scenario())
    assert sorted(k for k, _ in script.runs) == ["a1", "a2", "b1", "b2"]
    assert _stages(state)[2].is_started and not _stages(state)[3].is_started
    dispatch_stages = [c.stage for c in script.dispatch_contexts]
    assert dispatch_stages == [1, 2]  # the dispatch hook runs before each stage


def test_and_every_stage_succeeds(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, a_job_with_three_stages())
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert [(e.stage, e.successful_steps) for e in state.progress.stages] == [
        (1, 2),
        (2, 2),
        (3, 2),
    ]
    order = [k[0] for k, _ in script.runs]
    assert order == sorted(order)


def test_and_only_part_of_a_stage_has_completed_the_next_does_not_start(run, cluster, script):
    script.behaviour["a2"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, a_job_with_three_stages())
        await cluster.settle()
        return await cluster.manager().get(result.job_id)

    state = run(scenario())
    assert sorted(k for k, _ in script.runs) == ["a1", "a2"]
    assert not _stages(state)[2].is_started


def test_and_a_stage_is_still_running_when_one_of_its_steps_fails(run, cluster, script):
    script.behaviour["a1"].fail = True
    script.behaviour["a2"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, a_job_with_three_stages())
        await cluster.settle()
        during = await cluster.manager().get(result.job_id)
        script.release("a2")
        return during, await cluster.wait(result.job_id)

    during, state = run(scenario())
    assert during.status == JobStatus.RUNNING  # waits for the stage to end
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.unreachable_steps == 4


def _fail_stage(run, cluster, script, failing: str):
    script.behaviour[failing].fail = True

    async def scenario():
        result = await cluster.start(ScenarioJob, a_job_with_three_stages())
        return await cluster.wait(result.job_id)

    return run(scenario())


def test_and_the_first_stage_fails_later_steps_are_unreachable(run, cluster, script):
    state = _fail_stage(run, cluster, script, "a1")
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.failed_steps, state.progress.unreachable_steps) == (1, 4)
    steps = run(cluster.storage().steps.get_for_job(state.id))
    assert {s.id for s in steps if s.status == JobStepStatus.UNREACHABLE} == {
        s.id for s in steps if s.stage > 1
    }
    assert sorted(k for k, _ in script.runs) == ["a1", "a2"]


def test_and_a_middle_stage_fails(run, cluster, script):
    state = _fail_stage(run, cluster, script, "b2")
    assert (state.progress.successful_steps, state.progress.failed_steps) == (3, 1)
    assert state.progress.unreachable_steps == 2
    assert _stages(state)[3].unreachable_steps == 2


def test_and_the_last_stage_fails(run, cluster, script):
    state = _fail_stage(run, cluster, script, "c1")
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.unreachable_steps == 0 and state.progress.failed_steps == 1


def test_and_a_stage_that_continues_on_failure_fails_the_next_starts(run, cluster, script):
    script.continue_stages.add(1)
    state = _fail_stage(run, cluster, script, "a1")
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.unreachable_steps == 0
    assert state.progress.successful_steps == 5


def test_and_the_only_step_in_the_first_stage_fails_to_start(run, cluster, script):
    from choreography_ray.engine.messages import StartOutcome, StartResult

    real = cluster.start_steps

    async def refusing_a(job_key, job_id, job_type, starts, sticky, step_types=None):
        keys = {s.step_id: s for s in starts}
        states = await cluster.storage().steps.get_many(job_id, list(keys))
        bad = {s.id for s in states if s.name == "a"}
        answer = await real(
            job_key, job_id, job_type, [s for s in starts if s.step_id not in bad], sticky
        )
        answer.results.extend(StartResult(i, StartOutcome.FAILED, reason="no") for i in bad)
        return answer

    cluster.start_steps = refusing_a

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a", "b", stages={"a": 0, "b": 1}))
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.failed_steps, state.progress.unreachable_steps) == (1, 1)


def test_and_the_only_step_in_a_stage_that_continues_on_failure_fails_to_start(
    run, cluster, script
):
    from choreography_ray.engine.messages import StartOutcome, StartResult

    script.continue_stages.add(0)
    real = cluster.start_steps

    async def refusing_a(job_key, job_id, job_type, starts, sticky, step_types=None):
        states = await cluster.storage().steps.get_many(job_id, [s.step_id for s in starts])
        bad = {s.id for s in states if s.name == "a"}
        answer = await real(
            job_key, job_id, job_type, [s for s in starts if s.step_id not in bad], sticky
        )
        answer.results.extend(StartResult(i, StartOutcome.FAILED, reason="no") for i in bad)
        return answer

    cluster.start_steps = refusing_a

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a", "b", stages={"a": 0, "b": 1}))
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.successful_steps, state.progress.failed_steps) == (1, 1)


def test_when_resuming_and_the_job_has_stages_only_the_current_stage_resumes(run, cluster, script):
    script.behaviour["b1"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, a_job_with_three_stages())
        await cluster.settle()
        await cluster.crash()
        script.behaviour["b1"].block = False
        script.runs.clear()
        await cluster.manager().resume(result.job_id)
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert sorted(k for k, _ in script.runs) == ["b1", "c1", "c2"]


def test_when_resuming_and_the_job_was_left_at_a_failed_barrier(run, cluster, script):
    script.behaviour["a1"].fail = True
    script.fail_hooks.add("on_all_steps_completed")  # keeps it from completing cleanly

    async def scenario():
        result = await cluster.start(ScenarioJob, a_job_with_three_stages())
        await cluster.settle()
        # Rewind the job to Running as if it crashed right after the barrier stage ended.
        stored = await cluster.storage().jobs.get(result.job_id)
        await cluster.crash()
        stored.status = JobStatus.RUNNING
        await cluster.storage().jobs.save(stored)
        for step in await cluster.storage().steps.get_for_job(result.job_id):
            if step.stage > 1:
                step.status = JobStepStatus.UNKNOWN
                await cluster.storage().steps.save(step)
        script.fail_hooks.clear()
        script.runs.clear()
        await cluster.manager().resume(result.job_id)
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.unreachable_steps == 4
    assert script.runs == []


def test_when_resuming_and_the_job_was_left_between_two_stages(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, a_job_with_three_stages())
        await cluster.settle()
        stored = await cluster.storage().jobs.get(result.job_id)
        await cluster.crash()
        stored.status = JobStatus.RUNNING
        await cluster.storage().jobs.save(stored)
        for step in await cluster.storage().steps.get_for_job(result.job_id):
            if step.stage > 1:
                step.status = JobStepStatus.UNKNOWN
                await cluster.storage().steps.save(step)
        script.runs.clear()
        script.dispatch_contexts.clear()
        await cluster.manager().resume(result.job_id)
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert sorted(k for k, _ in script.runs) == ["b1", "b2", "c1", "c2"]
    assert script.dispatch_contexts[0].stage == 2 and script.dispatch_contexts[0].resuming


# -- planning and reconciling stages (pure) ------------------------------------------------------


def test_when_planning_with_every_step_in_one_stage_no_stages_are_recorded():
    assert counting.planned({0: 5}).stages == []
    assert counting.planned({0: 5}).total_steps == 5


def test_when_planning_with_steps_in_several_stages():
    progress = counting.planned({2: 1, 0: 3})
    assert [(e.stage, e.total_steps, e.is_started) for e in progress.stages] == [
        (0, 3, False),
        (2, 1, False),
    ]


def test_when_reconciling_from_steps_in_several_stages():
    base = counting.planned({0: 2, 1: 2})
    progress = counting.reconcile(
        base,
        {
            (0, JobStepStatus.COMPLETED_SUCCESSFULLY): 1,
            (0, JobStepStatus.FAILED): 1,
            (1, JobStepStatus.UNREACHABLE): 1,
            (1, JobStepStatus.RUNNING): 1,
        },
        started_stages=[0],
    )
    assert (progress.successful_steps, progress.failed_steps, progress.unreachable_steps) == (
        1,
        1,
        1,
    )
    first, second = progress.stages
    assert first.is_started and first.is_completed and first.has_failures
    assert not second.is_started and second.remaining_steps == 1


def test_for_job_progress_when_a_stage_has_not_started_its_steps_count_as_stopped():
    progress = counting.planned({0: 1, 1: 3})
    counting.mark_started(progress, 0)
    counting.count(progress, 0, JobStepStatus.STOPPED)
    assert progress.is_stopped and not progress.is_completed


def test_for_job_progress_when_steps_are_unreachable_the_job_is_completed_with_failures():
    progress = counting.planned({0: 1, 1: 2})
    counting.count(progress, 0, JobStepStatus.COMPLETED_SUCCESSFULLY)
    counting.count(progress, 1, JobStepStatus.UNREACHABLE)
    counting.count(progress, 1, JobStepStatus.UNREACHABLE)
    assert progress.is_completed and progress.has_failures


def test_when_finding_what_stopped_the_job_a_barrier_that_has_not_completed_is_not_yet_one():
    stage = JobStageProgress(stage=0, total_steps=3, successful_steps=1, failed_steps=1)
    assert stage.has_failures and not stage.is_completed
