"""Plan before run: every behaviour the planning seed states, and its "When start fails" table."""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.engine import planning
from choreography_ray.jobs import (
    CannotResumeJobError,
    JobsOptions,
    JobStatus,
    ResumeJobFailed,
    StartJobError,
    default_registry,
)
from choreography_ray.jobs.errors import NoEligibleJobWorker
from choreography_ray.jobs.job import Job
from choreography_ray.jobs.step import JobStep
from choreography_ray.storage.protocols import JobsStorage
from choreography_ray.testing import InProcessCluster, WriteFaults

from .fixtures import BackgroundJob, KeyRequest, KeyStep, ScenarioJob, request


class Recorder:
    """Wraps storage to record every job and step write in order, with what was written."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def wrap(self, storage: JobsStorage) -> JobsStorage:
        recorder = self

        class Jobs:
            def __getattr__(self, name):
                return getattr(storage.jobs, name)

            async def save(self, state):
                recorder.events.append(("job", state.model_copy(deep=True)))
                return await storage.jobs.save(state)

        class Steps:
            def __getattr__(self, name):
                return getattr(storage.steps, name)

            async def save_many(self, states):
                recorder.events.append(("steps", [s.model_copy() for s in states]))
                return await storage.steps.save_many(states)

        class Plans:
            def __getattr__(self, name):
                return getattr(storage.plans, name)

            async def save_plan(self, job_id, incarnation, steps):
                recorder.events.append(("plan", (incarnation, list(steps))))
                return await storage.plans.save_plan(job_id, incarnation, steps)

            async def delete_plan(self, job_id, incarnation):
                recorder.events.append(("delete-plan", incarnation))
                return await storage.plans.delete_plan(job_id, incarnation)

        return JobsStorage(storage.key, Jobs(), Steps(), Plans() if storage.plans else None)


async def _cluster(**kwargs) -> InProcessCluster:
    cluster = InProcessCluster(**kwargs)
    await cluster.provider.initialize()
    return cluster


# -- what the saved plan contains and when it is written ------------------------------------------


def test_the_complete_plan_is_saved_before_any_step_is_prepared(run, script):
    recorder = Recorder()

    async def scenario():
        cluster = await _cluster(wrap_storage=recorder.wrap)
        try:
            result = await cluster.start(ScenarioJob, request("a", "b", stages={"b": 1}))
            await cluster.wait(result.job_id)
        finally:
            await cluster.close()

    run(scenario())
    kinds = [kind for kind, _ in recorder.events]
    first_steps = kinds.index("steps")
    with_plan = [
        i for i, (kind, state) in enumerate(recorder.events) if kind == "job" and state.plan
    ]
    assert with_plan and with_plan[0] < first_steps
    plan = recorder.events[with_plan[0]][1].plan
    assert [(p.stage, p.step_type, p.request.data) for p in plan] == [
        (0, "scenario.key-step", {"key": "a"}),
        (1, "scenario.key-step", {"key": "b"}),
    ]
    prepared = recorder.events[first_steps][1]
    assert [s.id for s in prepared] == [p.step_id for p in plan]  # the planned identities


def test_a_one_step_start_commits_the_job_three_times_and_its_step_once(run, script):
    """PreparingJob, the plan with PreparingSteps, the step, Running before dispatch, then the
    progress of the dispatch: StartingSteps rides in the history of the Running write."""
    recorder = Recorder()

    async def scenario():
        cluster = await _cluster(wrap_storage=recorder.wrap)
        try:
            await cluster.start(ScenarioJob, request("a"))
            return list(recorder.events)
        finally:
            await cluster.close()

    events = run(scenario())
    assert [(kind, getattr(state, "status", None)) for kind, state in events] == [
        ("job", JobStatus.PREPARING_JOB),
        ("job", JobStatus.PREPARING_STEPS),
        ("steps", None),
        ("job", JobStatus.RUNNING),
        ("job", JobStatus.RUNNING),
    ]
    running = events[3][1]
    assert JobStatus.STARTING_STEPS in [c.status for c in running.status_changes]


def test_the_write_that_makes_the_job_running_drops_the_inline_plan(run, script):
    recorder = Recorder()

    async def scenario():
        cluster = await _cluster(wrap_storage=recorder.wrap)
        try:
            result = await cluster.start(ScenarioJob, request("a"))
            await cluster.wait(result.job_id)
        finally:
            await cluster.close()

    run(scenario())
    jobs = [state for kind, state in recorder.events if kind == "job"]
    running = [s for s in jobs if s.status == JobStatus.RUNNING]
    before = [s for s in jobs if s.status == JobStatus.PREPARING_STEPS]
    assert before[-1].plan is not None
    assert all(s.plan is None for s in running)
    # ...and before the first step is dispatched: every step write comes after it.
    first_running = next(
        i
        for i, (k, s) in enumerate(recorder.events)
        if k == "job" and s.status == JobStatus.RUNNING
    )
    step_writes = [i for i, (k, _) in enumerate(recorder.events) if k == "steps"]
    assert step_writes[0] < first_running < step_writes[1]


def test_a_step_sees_its_state_not_its_request(run, cluster, script):
    seen = []

    class Probe(JobStep[KeyRequest, KeyRequest, str], name="planning.probe-step"):
        def initialize_state(self, request):
            return KeyRequest(key=request.key.upper())

        async def perform(self, state, ctx):
            seen.append(state)
            return state.key

    class ProbeJob(Job[KeyRequest], name="planning.probe-job"):
        keep_after_completed = True

        def prepare_steps(self, request):
            return [self.create_step(Probe, request)]

    async def scenario():
        result = await cluster.start(ProbeJob, KeyRequest(key="abc"))
        return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert seen == [KeyRequest(key="ABC")]


@pytest.mark.parametrize("returns", ["request", "copy", "changed", "undeclared"])
def test_a_state_that_is_the_request_is_stored_from_the_plan_only_when_declared_so(
    run, cluster, monkeypatch, returns
):
    """`state_is_request`: the plan's payload of the request is stored as the first state,
    without dumping it again; a state that is another object is dumped as before."""
    registry = cluster.registry
    dumped: list[object] = []
    made: list[KeyRequest] = []  # the first states initialize_state returned
    dump = registry.dump

    def counting(value):
        dumped.append(value)
        return dump(value)

    class Declared(JobStep[KeyRequest, KeyRequest, str], name=f"planning.declared-{returns}"):
        state_is_request = returns != "undeclared"  # that one returns its request too

        def initialize_state(self, request):
            state = request
            if returns == "copy":
                state = request.model_copy()
            elif returns == "changed":
                state = KeyRequest(key=request.key + "!")
            made.append(state)
            return state

        async def perform(self, state, ctx):
            return state.key

    class DeclaredJob(Job[KeyRequest], name=f"planning.declared-job-{returns}"):
        keep_after_completed = True

        def prepare_steps(self, request):
            return [self.create_step(Declared, KeyRequest(key=k)) for k in ("a", "b")]

    async def scenario():
        monkeypatch.setattr(registry, "dump", counting)
        result = await cluster.start(DeclaredJob, KeyRequest(key="x"))
        monkeypatch.setattr(registry, "dump", dump)
        state = await cluster.wait(result.job_id)
        return state, await cluster.storage().steps.get_for_job(result.job_id)

    state, steps = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    states = sorted(registry.load(step.state).key for step in steps)
    results = sorted(registry.load(step.result).root for step in steps)
    suffix = "!" if returns == "changed" else ""
    assert states == results == [f"a{suffix}", f"b{suffix}"]
    prepared = [value for value in dumped if any(value is state for state in made)]
    assert len(made) == 2 and len(prepared) == (0 if returns == "request" else 2)


# -- When start fails ----------------------------------------------------------------------------


class OddRequest(KeyRequest):
    """A request whose JSON does not read back equal: a float that JSON rounds."""

    ratio: float = 0.1

    def model_dump(self, **kwargs):  # pragma: no cover - exercised through the registry
        data = super().model_dump(**kwargs)
        data["ratio"] = "not a number"
        return data


default_registry.register(OddRequest, kind="request", name="planning.odd-request")


def test_invalid_step_plan_fails_the_job_with_the_reason_and_no_plan(run, cluster, script):
    script.plan_override = lambda job, r: [job.create_step(KeyStep, OddRequest(key="x"))]

    async def scenario():
        result = await cluster.start(ScenarioJob, request())
        state = await cluster.storage().jobs.get(result.job_id)
        steps = await cluster.storage().steps.count_for_job(result.job_id)
        return result, state, steps

    result, state, steps = run(scenario())
    assert result.error == StartJobError.INVALID_STEP_PLAN
    assert "round trip" in result.reason or "reads back" in result.reason
    assert state.status == JobStatus.FAILED
    assert state.plan is None and not state.has_stored_step_plan
    assert state.status_changes[-1].exception_messages == [result.reason]
    assert steps == 0  # before any step is prepared


def test_a_step_planned_twice_is_an_invalid_plan(run, cluster, script):
    script.plan_override = lambda job, r: [
        job.create_step(KeyStep, KeyRequest(key="x"), step_id="same"),
        job.create_step(KeyStep, KeyRequest(key="y"), step_id="same"),
    ]

    async def scenario():
        return await cluster.start(ScenarioJob, request())

    result = run(scenario())
    assert result.error == StartJobError.INVALID_STEP_PLAN
    assert "planned twice" in result.reason


def test_could_not_prepare_job_steps_fails_the_job_and_runs_on_failed_to_prepare(
    run, cluster, script
):
    script.behaviour["b"].prepare_error = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a", "b"))
        return result, await cluster.storage().jobs.get(result.job_id)

    result, state = run(scenario())
    assert result.error == StartJobError.COULD_NOT_PREPARE_JOB_STEPS
    assert state.status == JobStatus.FAILED
    assert "cannot prepare b" in state.status_changes[-1].exception_messages[0]
    assert script.hooks == ["on_failed_to_prepare"]
    assert script.runs == []


def test_no_job_steps_to_start_completes_the_job_at_once(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request())
        return result, await cluster.storage().jobs.get(result.job_id)

    result, state = run(scenario())
    assert result.error == StartJobError.NO_JOB_STEPS_TO_START and result.succeeded
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_unknown_when_prepare_steps_raises_the_job_is_written_failed(run, cluster, script):
    def broken(job, r):
        raise RuntimeError("planning broke")

    script.plan_override = broken

    async def scenario():
        result = await cluster.start(ScenarioJob, request())
        return result, await cluster.storage().jobs.get(result.job_id)

    result, state = run(scenario())
    assert result.error == StartJobError.UNKNOWN
    assert state.status == JobStatus.FAILED
    assert state.status_changes[-1].exception_messages == ["RuntimeError: planning broke"]


def test_unknown_when_the_plan_write_fails_the_job_is_written_failed_without_its_plan(run, script):
    async def scenario():
        faults = WriteFaults(fail_at={2})  # 1: PreparingJob, 2: the plan with PreparingSteps
        cluster = await _cluster(wrap_storage=faults.wrap)
        try:
            result = await cluster.start(ScenarioJob, request("a"))
            return result, await cluster.storage().jobs.get(result.job_id)
        finally:
            await cluster.close()

    result, state = run(scenario())
    assert result.error == StartJobError.UNKNOWN
    assert state.status == JobStatus.FAILED and state.plan is None


def test_unknown_when_writing_failed_fails_too_the_job_keeps_its_stored_plan(run, script):
    async def scenario():
        # 1 PreparingJob, 2 plan, 3 steps (fails), 4 Failed (fails too).
        faults = WriteFaults(fail_at={3, 4})
        cluster = await _cluster(wrap_storage=faults.wrap)
        try:
            result = await cluster.start(ScenarioJob, request("a"))
            stored = await cluster.storage().jobs.get(result.job_id)
            released = cluster.manager().activation(result.job_id) is None
            # Recovery continues from the kept plan.
            await cluster.crash()
            await (await cluster.manager().rehydrate())
            return result, stored, released, await cluster.wait(result.job_id)
        finally:
            await cluster.close()

    result, stored, released, final = run(scenario())
    assert result.error == StartJobError.UNKNOWN
    assert stored.status == JobStatus.PREPARING_STEPS and stored.plan is not None
    assert released
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY


# -- background starts --------------------------------------------------------------------------


def test_start_in_background_returns_once_the_job_is_durable(run, cluster, script):
    async def scenario():
        result = await cluster.start(BackgroundJob, request("a", "b"))
        at_return = await cluster.storage().jobs.get(result.job_id)
        runs_at_return = list(script.runs)
        return result, at_return, runs_at_return, await cluster.wait(result.job_id)

    result, at_return, runs_at_return, final = run(scenario())
    assert result.error is None
    assert at_return.status == JobStatus.PREPARING_STEPS and at_return.plan is not None
    assert runs_at_return == []
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_start_in_background_failures_are_handled_by_the_job(run, cluster, script):
    script.behaviour["b"].prepare_error = True

    async def scenario():
        result = await cluster.start(BackgroundJob, request("a", "b"))
        return result, await cluster.wait(result.job_id)

    result, final = run(scenario())
    assert result.error is None  # start could not know
    assert final.status == JobStatus.FAILED
    assert "on_failed_to_prepare" in script.hooks


def test_preparing_in_the_background_lets_the_loop_run_between_batches(run, script):
    """A batch written inline (SQLite, memory) never suspends: preparation must yield by itself,
    or the answer of the start that already returned waits until every step is prepared."""
    ticks = 0
    seen: list[int] = []

    def wrap(storage: JobsStorage) -> JobsStorage:
        class Steps:
            def __getattr__(self, name):
                return getattr(storage.steps, name)

            async def save_many(self, states):
                seen.append(ticks)
                return await storage.steps.save_many(states)

        return JobsStorage(key=storage.key, jobs=storage.jobs, steps=Steps(), plans=storage.plans)

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def scenario():
        cluster = await _cluster(wrap_storage=wrap, options=JobsOptions(max_parallel_steps=8))
        task = asyncio.create_task(ticker())
        try:
            result = await cluster.start(BackgroundJob, request(*(f"k{n}" for n in range(2_500))))
            await cluster.wait(result.job_id)
        finally:
            task.cancel()
            await cluster.close()

    run(scenario())
    prepared = seen[:3]  # batches of 1,000, 1,000 and 500
    assert len(set(prepared)) == 3


def test_a_step_planned_twice_in_different_chunks_is_an_invalid_plan(
    run, cluster, script, monkeypatch
):
    monkeypatch.setattr(planning, "PLAN_CHUNK", 2)
    script.plan_override = lambda job, r: [
        job.create_step(KeyStep, KeyRequest(key=key), step_id=key) for key in "abcda"
    ]

    async def scenario():
        return await cluster.start(ScenarioJob, request())

    result = run(scenario())
    assert result.error == StartJobError.INVALID_STEP_PLAN
    assert "'a' is planned twice" in result.reason


def test_a_plan_built_in_chunks_keeps_the_order_of_prepare_steps(run, cluster, script, monkeypatch):
    monkeypatch.setattr(planning, "PLAN_CHUNK", 2)
    keys = [f"k{n}" for n in range(7)]

    async def scenario():
        result = await cluster.start(ScenarioJob, request(*keys))
        await cluster.wait(result.job_id)
        steps = await cluster.storage().steps.get_for_job(result.job_id)
        return result, steps

    result, steps = run(scenario())
    assert result.error is None
    assert sorted(step.name for step in steps) == sorted(keys)


# -- initialize before dispatch -----------------------------------------------------------------


def test_a_failing_dispatch_hook_starts_no_steps(run, cluster, script):
    script.fail_hooks.add("on_before_dispatching_job_steps")

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        return result, await cluster.wait(result.job_id)

    result, state = run(scenario())
    assert result.error == StartJobError.UNKNOWN
    assert script.runs == []
    assert state.status == JobStatus.FAILED


@pytest.mark.parametrize("fail_from", [3, 4], ids=["steps-not-stored", "steps-stored"])
def test_recovery_of_a_starting_job_prepares_only_what_is_missing_and_says_so(
    run, script, fail_from
):
    async def scenario():
        # Interrupt preparation: the step batch fails once and storage "goes away".
        # Writes: 1 PreparingJob, 2 plan, 3 prepared steps, 4 Running (StartingSteps is in
        # the history the Running write carries, not written by itself).
        faults = WriteFaults(fail_from=fail_from)
        cluster = await _cluster(wrap_storage=faults.wrap)
        try:
            result = await cluster.start(ScenarioJob, request("a", "b"))
            plan_ids = None
            stored = await cluster.storage().jobs.get(result.job_id)
            plan_ids = [p.step_id for p in stored.plan]
            faults.fail_from = None
            await cluster.crash()
            script.hooks.clear()
            await (await cluster.manager().rehydrate())
            final = await cluster.wait(result.job_id)
            steps = await cluster.storage().steps.get_for_job(result.job_id)
            return stored, plan_ids, final, steps
        finally:
            await cluster.close()

    stored, plan_ids, final, steps = run(scenario())
    assert stored.status == JobStatus.PREPARING_STEPS
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert sorted(s.id for s in steps) == sorted(plan_ids)  # original identities
    assert "on_before_starting_job_steps" not in script.hooks  # never replayed
    assert script.dispatch_contexts[-1].initialization_may_be_incomplete is True


@pytest.mark.parametrize("error", [NoEligibleJobWorker("none qualifies"), ConnectionError("gone")])
def test_recovery_of_a_starting_job_that_no_worker_takes_keeps_it_running_and_sends_again(
    run, script, error
):
    """Finishing a preparation is a resume, not a start: the placement spec's resume moment."""

    async def scenario():
        faults = WriteFaults(fail_from=4)  # interrupted with its steps stored (see above)
        cluster = await _cluster(wrap_storage=faults.wrap)
        try:
            result = await cluster.start(ScenarioJob, request("a", "b"))
            faults.fail_from = None
            await cluster.crash()
            cluster.dispatch_fault = error
            report = await (await cluster.manager().rehydrate())
            during = await cluster.manager().get(result.job_id)
            cluster.dispatch_fault = None
            await cluster.advance(cluster.options.job_watchdog_interval.total_seconds())
            return report, during, await cluster.wait(result.job_id)
        finally:
            await cluster.close()

    report, during, final = run(scenario())
    assert report.resumed == [final.id]
    assert during.status == JobStatus.RUNNING and during.progress.failed_steps == 0
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_the_flag_is_false_on_an_ordinary_resume(run, cluster, script):
    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        await cluster.settle()
        script.behaviour["a"].block = False
        await cluster.manager().resume(result.job_id)
        return await cluster.wait(result.job_id)

    run(scenario())
    assert [c.initialization_may_be_incomplete for c in script.dispatch_contexts] == [False, False]
    assert script.hooks.index("on_before_resuming_job_steps") < len(script.hooks) - 1


def test_an_older_job_left_preparing_without_a_plan_cannot_resume(run, cluster, script):
    from choreography_ray.jobs import JobState

    async def scenario():
        await cluster.storage().jobs.save(
            JobState(
                id="old",
                key=cluster.manager().ctx.key,
                type="scenario.job",
                status=JobStatus.STARTING_STEPS,
                created=cluster.clock.now(),
            )
        )
        await cluster.manager().resume("old")

    with pytest.raises(ResumeJobFailed) as raised:
        run(scenario())
    assert raised.value.code == CannotResumeJobError.MISSING_STEP_PLAN


# -- large plans stay out of the job document -----------------------------------------------------


@pytest.mark.parametrize("limit", [0, 200])
def test_a_large_plan_is_stored_apart_with_a_fresh_incarnation(run, script, limit):
    recorder = Recorder()

    async def scenario():
        cluster = await _cluster(
            wrap_storage=recorder.wrap, options=JobsOptions(max_inline_step_plan_size=limit)
        )
        try:
            result = await cluster.start(ScenarioJob, request("a", "b", "c"))
            return await cluster.wait(result.job_id)
        finally:
            await cluster.close()

    final = run(scenario())
    kinds = [k for k, _ in recorder.events]
    plan_at = kinds.index("plan")
    fenced = recorder.events[plan_at - 1][1]
    assert fenced.stored_step_plan_incarnation == 1 and not fenced.has_stored_step_plan
    after = recorder.events[plan_at + 1][1]
    assert after.has_stored_step_plan and after.plan is None
    assert recorder.events[plan_at][1][0] == 1
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert not final.has_stored_step_plan  # cleared at Running...
    assert ("delete-plan", 1) in recorder.events  # ...and deleted once durably terminal


def test_a_small_plan_stays_inline_and_plan_storage_is_never_contacted(run, script):
    recorder = Recorder()

    async def scenario():
        cluster = await _cluster(wrap_storage=recorder.wrap)
        try:
            result = await cluster.start(ScenarioJob, request("a"))
            await cluster.wait(result.job_id)
        finally:
            await cluster.close()

    run(scenario())
    assert not any(k in ("plan", "delete-plan") for k, _ in recorder.events)


def test_without_plan_storage_a_large_plan_stays_inline(run, script):
    def no_plans(storage):
        return JobsStorage(storage.key, storage.jobs, storage.steps, None)

    async def scenario():
        cluster = await _cluster(
            wrap_storage=no_plans, options=JobsOptions(max_inline_step_plan_size=0)
        )
        try:
            result = await cluster.start(ScenarioJob, request("a", "b"))
            return await cluster.wait(result.job_id)
        finally:
            await cluster.close()

    assert run(scenario()).status == JobStatus.COMPLETED_SUCCESSFULLY


def test_a_failed_plan_deletion_does_not_fail_completion(run, script):
    async def scenario():
        cluster = await _cluster(options=JobsOptions(max_inline_step_plan_size=0))

        async def broken_delete(job_id, incarnation):
            raise RuntimeError("plan store down")

        try:
            cluster.storage().plans.delete_plan = broken_delete
            result = await cluster.start(ScenarioJob, request("a"))
            return await cluster.wait(result.job_id)
        finally:
            await cluster.close()

    assert run(scenario()).status == JobStatus.COMPLETED_SUCCESSFULLY


def test_recovery_reloads_an_external_plan_of_its_own_incarnation(run, script):
    async def scenario():
        faults = WriteFaults(fail_from=5)  # after PreparingJob, fence, plan, PreparingSteps
        cluster = await _cluster(
            wrap_storage=faults.wrap, options=JobsOptions(max_inline_step_plan_size=0)
        )
        try:
            result = await cluster.start(ScenarioJob, request("a", "b"))
            stored = await cluster.storage().jobs.get(result.job_id)
            faults.fail_from = None
            await cluster.crash()
            await (await cluster.manager().rehydrate())
            return stored, await cluster.wait(result.job_id)
        finally:
            await cluster.close()

    stored, final = run(scenario())
    assert stored.has_stored_step_plan and stored.stored_step_plan_incarnation == 1
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert sorted(k for k, _ in script.runs) == ["a", "b"]


class RatioRequest(KeyRequest):
    ratio: float


default_registry.register(RatioRequest, kind="request", name="planning.ratio-request")


@pytest.mark.parametrize("ratio", [float("nan"), float("inf"), float("-inf")])
def test_a_step_request_with_nan_or_infinity_is_an_invalid_plan_and_nothing_is_planned(
    run, cluster, script, ratio
):
    # Storage writes NaN and infinity as null: the step would be recovered with another request.
    script.plan_override = lambda job, r: [
        job.create_step(KeyStep, KeyRequest(key="fine")),
        job.create_step(KeyStep, RatioRequest(key="x", ratio=ratio)),
    ]

    async def scenario():
        result = await cluster.start(ScenarioJob, request())
        state = await cluster.storage().jobs.get(result.job_id)
        steps = await cluster.storage().steps.count_for_job(result.job_id)
        return result, state, steps

    result, state, steps = run(scenario())
    assert result.error == StartJobError.INVALID_STEP_PLAN
    assert "RatioRequest request holds" in result.reason and "ratio" in result.reason
    assert state.status == JobStatus.FAILED
    assert state.plan is None and not state.has_stored_step_plan
    assert steps == 0
    assert script.runs == []


@pytest.mark.parametrize("steps", [1, 255, 256, 257, 700])
def test_a_plan_is_weighed_as_its_entries_written_one_by_one(steps):
    """The plan is weighed a chunk of entries at a time; the size, and the answer at the limit
    and one below it, are those of writing each entry alone (names of several bytes a
    character included: the size counts characters, as the job record's text does)."""
    from choreography_ray.jobs.registry import Payload
    from choreography_ray.jobs.state import PlannedStep

    plan = [
        PlannedStep(
            step_id=f"s{n}",
            stage=n % 3,
            step_type="noop",
            name="été" * (n % 4),
            request=Payload(type="item", data={"n": n}),
        )
        for n in range(steps)
    ]
    size = sum(len(step.model_dump_json()) + 1 for step in plan) + 2
    assert planning.plan_size(plan) == size
    assert not planning.plan_exceeds(plan, size)
    assert planning.plan_exceeds(plan, size - 1)
    assert planning.plan_exceeds(plan, size // 2) and not planning.plan_exceeds([], 2)
