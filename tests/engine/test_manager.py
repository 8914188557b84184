"""JobsManager scenarios: reference §h `for_JobsManager` and the integration scenarios of
`for_JobsManager/when_starting/job_with_single_step/...`.

Every scenario runs on an in-process cluster with a fake clock. A crash (`cluster.crash()`)
loses every process without writing anything; `cluster.manager().rehydrate()` recovers.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from choreography_ray.jobs import (
    PREPARING_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    CannotResumeJobError,
    JobKey,
    JobNotFoundError,
    JobsOptions,
    JobState,
    JobStatus,
    JobStepState,
    JobStepStatus,
    PlannedStep,
    RemoveJobError,
    RemoveJobFailed,
    ResumeJobFailed,
    ResumeJobSuccess,
    StartJobError,
    StatusChange,
    StopJobError,
    StopJobFailed,
    StorageUnavailableError,
    default_registry,
)
from choreography_ray.storage.protocols import JobQuery, JobsStorage
from choreography_ray.testing import FakeClock, InProcessCluster

from .fixtures import (
    ClearingJob,
    KeyRequest,
    KeyState,
    KeyStep,
    ScenarioJob,
    ScenarioRequest,
    Script,
    request,
)

HOUR = 3600.0
DAY = 24 * HOUR


# -- jobs these scenarios need beyond the shared fixtures ---------------------------------------


class Resumes:
    """What `GatedResumeJob` saw: resumes in order, how many at once, and gates that hold them."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.active = 0
        self.peak = 0
        self.hold = False
        self.fail: set[str] = set()
        self.gates: dict[str, asyncio.Event] = {}

    def gate(self, job_id: str) -> asyncio.Event:
        return self.gates.setdefault(job_id, asyncio.Event())

    def release(self, job_id: str) -> None:
        self.gate(job_id).set()


RESUMES = Resumes()


class GatedResumeJob(ScenarioJob, name="tests.manager.gated-resume-job"):
    """Its resume hook counts concurrent recoveries and, while `RESUMES.hold`, waits to go on."""

    async def on_before_resuming_job_steps(self) -> None:
        job_id = self.info.id
        RESUMES.order.append(job_id)
        RESUMES.active += 1
        RESUMES.peak = max(RESUMES.peak, RESUMES.active)
        try:
            if RESUMES.hold:
                await RESUMES.gate(job_id).wait()
        finally:
            RESUMES.active -= 1
        if job_id in RESUMES.fail:
            raise RuntimeError(f"resume of {job_id} failed on purpose")
        self._record("on_before_resuming_job_steps")


class UnresumableJob(ScenarioJob, name="tests.manager.unresumable-job"):
    can_resume = False


class OtherJob(ScenarioJob, name="tests.manager.other-job"):
    """Just another job type, for listings by type."""


class StuckPreparingJob(ScenarioJob, name="tests.manager.stuck-preparing-job"):
    """Never finishes planning: the process dies while it is still in PreparingJob."""

    async def prepare_steps(self, request: ScenarioRequest) -> list[Any]:
        await asyncio.Event().wait()
        return []


@pytest.fixture(autouse=True)
def resumes() -> Any:
    global RESUMES
    RESUMES = Resumes()
    yield RESUMES
    RESUMES = Resumes()


# -- storage interception -------------------------------------------------------------------


Hook = Callable[..., Awaitable[Any]]


class Interceptor:
    """Wraps a partition's storage: records every call, and lets a test replace any of them.

    Hooks are keyed "jobs.<method>" / "steps.<method>" and get the real method first.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.hooks: dict[str, Hook] = {}

    def wrap(self, storage: JobsStorage) -> JobsStorage:
        return JobsStorage(
            key=storage.key,
            jobs=_Intercepted(storage.jobs, "jobs", self),
            steps=_Intercepted(storage.steps, "steps", self),
            plans=storage.plans,
        )

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def index_of(self, name: str, first_arg: Any) -> int:
        for index, (called, args) in enumerate(self.calls):
            if called == name and args and args[0] == first_arg:
                return index
        raise AssertionError(f"{name}({first_arg!r}) was never called")


class _Intercepted:
    def __init__(self, inner: Any, part: str, interceptor: Interceptor) -> None:
        self._inner = inner
        self._part = part
        self._interceptor = interceptor

    def __getattr__(self, attribute: str) -> Any:
        target = getattr(self._inner, attribute)
        if not inspect.iscoroutinefunction(target):
            return target
        name = f"{self._part}.{attribute}"
        interceptor = self._interceptor

        async def call(*args: Any, **kwargs: Any) -> Any:
            interceptor.calls.append((name, args))
            hook = interceptor.hooks.get(name)
            if hook is not None:
                return await hook(target, *args, **kwargs)
            return await target(*args, **kwargs)

        return call


@contextlib.asynccontextmanager
async def new_cluster(
    options: JobsOptions | None = None, *, wrap_storage: Any = None
) -> AsyncIterator[InProcessCluster]:
    cluster = InProcessCluster(
        options=options or JobsOptions(max_parallel_steps=8),
        clock=FakeClock(),
        wrap_storage=wrap_storage,
    )
    await cluster.provider.initialize()
    try:
        yield cluster
    finally:
        await cluster.close()


# -- helpers --------------------------------------------------------------------------------


async def stored(cluster: InProcessCluster, job_id: str) -> JobState | None:
    return await cluster.storage().jobs.find(job_id)


async def steps_of(cluster: InProcessCluster, job_id: str) -> list[JobStepState]:
    return await cluster.storage().steps.get_for_job(job_id)


def crafted_job(
    job_id: str,
    status: JobStatus,
    created: datetime,
    *,
    job_type: str = ScenarioJob.name,
    plan: list[PlannedStep] | None = None,
    has_stored_step_plan: bool = False,
) -> JobState:
    """A job record as an earlier process could have left it."""
    return JobState(
        id=job_id,
        key=JobKey(),
        type=job_type,
        status=status,
        created=created,
        status_changes=[StatusChange(status=int(status), occurred=created)],
        request=default_registry.dump(ScenarioRequest()),
        plan=plan,
        has_stored_step_plan=has_stored_step_plan,
        stored_step_plan_incarnation=1 if has_stored_step_plan else None,
    )


def planned_step(key: str) -> PlannedStep:
    return PlannedStep(
        step_id=f"step-{key}",
        step_type=KeyStep.name,
        name=key,
        request=default_registry.dump(KeyRequest(key=key)),
    )


def prepared_step(job_id: str, key: str) -> JobStepState:
    return JobStepState(
        id=f"step-{key}",
        job_id=job_id,
        type=KeyStep.name,
        name=key,
        is_prepared=True,
        state=default_registry.dump(KeyState(key=key)),
    )


async def interrupt(
    cluster: InProcessCluster,
    script: Script,
    keys: list[str],
    *,
    job_type: type[ScenarioJob] = ScenarioJob,
    spacing: float = 1.0,
) -> list[str]:
    """Start one job per key (job id = key) whose step blocks, then lose every process."""
    ids = []
    for key in keys:
        script.behaviour[key].block = True
        result = await cluster.start(job_type, request(key), job_id=key)
        assert result.error is None, result
        ids.append(result.job_id)
        await cluster.advance(spacing)
    await cluster.settle()
    assert all(script.ran(key) == 1 for key in keys)
    await cluster.crash()
    return ids


async def restatus(cluster: InProcessCluster, job_id: str, status: JobStatus) -> None:
    """Write a new status as an earlier activation would have, just before its process died."""
    state = await stored(cluster, job_id)
    assert state is not None
    state.status = status
    state.stop_finalized = False
    state.status_changes = [
        *state.status_changes,
        StatusChange(status=int(status), occurred=cluster.clock.now()),
    ]
    await cluster.storage().jobs.save(state)


def hook_count(script: Script, name: str) -> int:
    return script.hooks.count(name)


# == starting ==================================================================================


def test_when_starting_a_job_it_is_stored_prepared_and_its_steps_run(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a", "b"))
        return result, await cluster.wait(result.job_id)

    result, state = run(scenario())
    assert result.error is None and result.succeeded
    assert state.type == ScenarioJob.name
    assert state.created == cluster.clock.now()
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    history = [JobStatus(c.status) for c in state.status_changes]
    assert history[:3] == [
        JobStatus.PREPARING_JOB,
        JobStatus.PREPARING_STEPS,
        JobStatus.STARTING_STEPS,
    ]
    assert history[-2:] == [JobStatus.RUNNING, JobStatus.COMPLETED_SUCCESSFULLY]
    assert sorted(k for k, _ in script.runs) == ["a", "b"]
    assert hook_count(script, "on_before_starting_job_steps") == 1


def test_jobs_started_without_an_id_get_ids_ordered_by_time(run, cluster):
    """A job's id leads every key of its step records: an id after the other jobs' puts a new
    job's rows at the end of each index (a random one put them among the others' rows, and a
    SQLite insert cost 5.4 µs a row against 3.1, benchmarks/RESULTS.md)."""

    async def scenario():
        return [(await cluster.start(ScenarioJob, request("a"))).job_id for _ in range(5)]

    ids = run(scenario())
    assert len(set(ids)) == 5 and ids == sorted(ids)
    assert all(uuid.UUID(hex=job_id).version == 7 for job_id in ids)


def test_when_starting_a_job_that_doesnt_exist_yet_under_a_given_id_it_is_created(
    run, cluster, script
):
    async def scenario():
        manager = cluster.manager()
        with pytest.raises(JobNotFoundError):
            await manager.get("order-42")
        result = await cluster.start(ScenarioJob, request("a"), job_id="order-42")
        return result, await cluster.wait("order-42")

    result, state = run(scenario())
    assert result.job_id == "order-42"
    assert result.error is None
    assert state is not None and state.id == "order-42"
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_when_starting_a_job_type_that_doesnt_exist_it_is_refused_and_nothing_is_left_behind(
    run, cluster, script
):
    async def scenario():
        manager = cluster.manager()
        with pytest.raises(TypeError):
            await cluster.start(KeyStep, KeyRequest(key="a"), job_id="not-a-job")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            # a job type, but the wrong request for it
            await cluster.start(ScenarioJob, KeyRequest(key="a"), job_id="wrong-request")
        await cluster.settle()
        for job_id in ("not-a-job", "wrong-request"):
            with pytest.raises(JobNotFoundError):
                await manager.get(job_id)
        return await manager.list()

    assert run(scenario()) == []
    assert script.runs == []


def test_when_starting_a_job_with_a_caller_supplied_id_twice_the_same_job_is_returned(
    run, cluster, script
):
    """After the first completed: the second start is refused, no second job, no second run."""

    async def scenario():
        first = await cluster.start(ScenarioJob, request("a"), job_id="once")
        await cluster.settle()
        second = await cluster.start(ScenarioJob, request("b"), job_id="once")
        await cluster.settle()
        return first, second, await cluster.manager().list()

    first, second, jobs = run(scenario())
    assert first.job_id == second.job_id == "once"
    assert first.error is None
    assert second.error == StartJobError.ALREADY_COMPLETED
    assert [job.id for job in jobs] == ["once"]
    assert jobs[0].status == JobStatus.COMPLETED_SUCCESSFULLY
    assert [k for k, _ in script.runs] == ["a"]


def test_when_starting_a_job_with_a_caller_supplied_id_twice_while_it_runs_the_same_job_is_returned(
    run, cluster, script
):
    async def scenario():
        script.behaviour["a"].block = True
        first = await cluster.start(ScenarioJob, request("a"), job_id="once")
        await cluster.settle()
        second = await cluster.start(ScenarioJob, request("b"), job_id="once")
        await cluster.settle()
        script.release("a")
        state = await cluster.wait("once")
        return first, second, state, await cluster.manager().list()

    first, second, state, jobs = run(scenario())
    assert first.job_id == second.job_id == "once"
    assert second.error == StartJobError.ALREADY_BEEN_PREPARED
    assert [job.id for job in jobs] == ["once"]
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.total_steps == 1
    assert [k for k, _ in script.runs] == ["a"]


def test_when_starting_a_job_with_a_caller_supplied_id_twice_at_once_only_one_job_runs(
    run, cluster, script
):
    async def scenario():
        script.behaviour["a"].block = True
        script.behaviour["b"].block = True
        results = await asyncio.gather(
            cluster.start(ScenarioJob, request("a"), job_id="once"),
            cluster.start(ScenarioJob, request("b"), job_id="once"),
        )
        await cluster.settle()
        ran = sorted(k for k, _ in script.runs)
        script.release("a", "b")
        state = await cluster.wait("once")
        return results, ran, state, await cluster.manager().list()

    results, ran, state, jobs = run(scenario())
    assert [r.job_id for r in results] == ["once", "once"]
    errors = sorted((r.error for r in results), key=lambda e: -1 if e is None else int(e))
    assert errors == [None, StartJobError.ALREADY_BEEN_PREPARED]
    assert len(ran) == 1, f"both requests ran steps: {ran}"
    assert [job.id for job in jobs] == ["once"]
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.total_steps == state.progress.successful_steps == 1
    assert sorted(k for k, _ in script.runs) == ran


# == resuming ==================================================================================


def test_when_resuming_an_interrupted_job_the_job_takes_it_and_runs_its_step_again(
    run, cluster, script
):
    async def scenario():
        [job_id] = await interrupt(cluster, script, ["a"])
        answer = await cluster.manager().resume(job_id)
        await cluster.settle()
        ran = script.ran("a")
        script.release("a")
        return answer, ran, await cluster.wait(job_id)

    answer, ran, state = run(scenario())
    assert answer == ResumeJobSuccess.SUCCESS
    assert ran == 2
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 1


def test_when_resuming_a_job_the_job_refuses_and_stays_as_it_was(run, cluster, script):
    async def scenario():
        script.behaviour["a"].block = True
        result = await cluster.start(UnresumableJob, request("a"))
        await cluster.settle()
        manager = cluster.manager()
        await manager.stop(result.job_id)
        await cluster.settle()
        with pytest.raises(ResumeJobFailed) as refused:
            await manager.resume(result.job_id)
        await cluster.settle()
        return refused.value, await stored(cluster, result.job_id)

    refused, state = run(scenario())
    assert refused.code == CannotResumeJobError.JOB_CANNOT_BE_RESUMED
    assert state.status == JobStatus.STOPPED
    assert script.ran("a") == 1
    assert hook_count(script, "on_before_resuming_job_steps") == 0


def test_when_resuming_a_job_that_is_stopped_it_runs_again_to_completion(run, cluster, script):
    async def scenario():
        script.behaviour["a"].block = True
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        manager = cluster.manager()
        await manager.stop(result.job_id)
        await cluster.settle()
        answer = await manager.resume(result.job_id)
        await cluster.settle()
        running = await manager.get(result.job_id)
        script.release("a")
        return answer, running, await cluster.wait(result.job_id)

    answer, running, state = run(scenario())
    assert answer == ResumeJobSuccess.SUCCESS
    assert running.status == JobStatus.RUNNING
    assert running.progress.stopped_steps == 0
    assert script.ran("a") == 2
    assert hook_count(script, "on_before_resuming_job_steps") == 1
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 1
    assert state.progress.stopped_steps == 0


def test_when_resuming_a_job_that_doesnt_exist_it_is_not_found(run, cluster, script):
    async def scenario():
        with pytest.raises(JobNotFoundError):
            await cluster.manager().resume("no-such-job")

    run(scenario())


# == stopping and deleting =====================================================================


def test_when_stopping_a_job_its_steps_stop_and_it_stays_stopped(run, cluster, script):
    async def scenario():
        script.behaviour["a"].block = True
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        state = await cluster.wait(result.job_id)
        return state, await steps_of(cluster, result.job_id)

    state, steps = run(scenario())
    assert state.status == JobStatus.STOPPED
    assert state.stop_finalized
    assert state.progress.stopped_steps == 1
    assert [s.status for s in steps] == [JobStepStatus.STOPPED]
    assert hook_count(script, "on_stopped") == 1


def test_when_stopping_a_job_that_doesnt_exist_it_is_not_found(run, cluster, script):
    async def scenario():
        with pytest.raises(JobNotFoundError):
            await cluster.manager().stop("no-such-job")

    run(scenario())


def test_when_stopping_a_job_that_has_completed_it_is_refused(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        with pytest.raises(StopJobFailed) as refused:
            await cluster.manager().stop(result.job_id)
        return refused.value, await stored(cluster, result.job_id)

    refused, state = run(scenario())
    assert refused.code == StopJobError.JOB_IS_COMPLETED
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_when_deleting_a_job_it_and_its_steps_are_removed(run, cluster, script):
    async def scenario():
        script.behaviour["a"].block = True
        result = await cluster.start(ScenarioJob, request("a", "b"))
        await cluster.settle()
        await cluster.manager().remove(result.job_id)
        state = await cluster.wait(result.job_id)
        return state, await steps_of(cluster, result.job_id)

    state, steps = run(scenario())
    assert state is None
    assert steps == []
    assert hook_count(script, "on_stopped") == 1


def test_when_deleting_a_job_that_doesnt_exist_it_is_not_found(run, cluster, script):
    async def scenario():
        with pytest.raises(JobNotFoundError):
            await cluster.manager().remove("no-such-job")

    run(scenario())


def test_when_deleting_a_job_that_has_completed_it_is_refused(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        with pytest.raises(RemoveJobFailed) as refused:
            await cluster.manager().remove(result.job_id)
        return refused.value, await stored(cluster, result.job_id)

    refused, state = run(scenario())
    assert refused.code == RemoveJobError.JOB_IS_COMPLETED
    assert state is not None and state.status == JobStatus.COMPLETED_SUCCESSFULLY


# == listing ===================================================================================


def test_when_getting_jobs_of_a_type_only_jobs_of_that_type_are_returned(run, cluster, script):
    async def scenario():
        mine = [
            (await cluster.start(ScenarioJob, request("a"))).job_id,
            (await cluster.start(ScenarioJob, request("b"))).job_id,
        ]
        other = (await cluster.start(OtherJob, request("c"))).job_id
        await cluster.settle()
        manager = cluster.manager()
        return (
            mine,
            other,
            await manager.list(JobQuery(type=ScenarioJob.name)),
            await manager.list(JobQuery(type=OtherJob.name)),
        )

    mine, other, of_scenario, of_other = run(scenario())
    assert sorted(job.id for job in of_scenario) == sorted(mine)
    assert all(job.type == ScenarioJob.name for job in of_scenario)
    assert [job.id for job in of_other] == [other]


def test_when_listing_jobs_by_a_query_they_are_filtered_and_paged_oldest_first(
    run, cluster, script
):
    async def scenario():
        script.behaviour["live"].block = True
        for key in ("j3", "j1", "live", "j2"):
            await cluster.start(ScenarioJob, request(key), job_id=key)
            await cluster.advance(10)
        await cluster.settle()
        manager = cluster.manager()
        third_created = (await manager.get("live")).created
        return {
            "all": await manager.list(),
            "running": await manager.list(JobQuery(statuses=frozenset({JobStatus.RUNNING}))),
            "before": await manager.list(JobQuery(created_before=third_created)),
            "page": await manager.list(JobQuery(skip=1, take=2)),
            "completed": await manager.list(
                JobQuery(
                    type=ScenarioJob.name,
                    statuses=frozenset({JobStatus.COMPLETED_SUCCESSFULLY}),
                )
            ),
        }

    found = run(scenario())
    ids = {name: [job.id for job in jobs] for name, jobs in found.items()}
    assert ids["all"] == ["j3", "j1", "live", "j2"]
    assert ids["running"] == ["live"]
    assert ids["before"] == ["j3", "j1"]
    assert ids["page"] == ["j1", "live"]
    assert ids["completed"] == ["j3", "j1", "j2"]


# == cleaning up dead jobs =====================================================================


def test_when_cleaning_up_dead_jobs_only_old_preparing_jobs_without_steps_or_plan_are_removed(
    run, cluster, script
):
    async def scenario():
        jobs = cluster.storage().jobs
        now = cluster.clock.now()
        old = now - timedelta(hours=2)
        young = now - timedelta(minutes=10)
        records = [
            crafted_job("dead-preparing-job", JobStatus.PREPARING_JOB, old),
            crafted_job("dead-preparing-steps", JobStatus.PREPARING_STEPS, old),
            crafted_job("young", JobStatus.PREPARING_JOB, young),
            crafted_job("inline-plan", JobStatus.PREPARING_STEPS, old, plan=[planned_step("p")]),
            crafted_job("empty-inline-plan", JobStatus.PREPARING_STEPS, old, plan=[]),
            crafted_job("stored-plan", JobStatus.PREPARING_STEPS, old, has_stored_step_plan=True),
            crafted_job("with-a-step", JobStatus.PREPARING_STEPS, old),
            crafted_job("starting", JobStatus.STARTING_STEPS, old),
            crafted_job("running", JobStatus.RUNNING, old),
            crafted_job("failed", JobStatus.FAILED, old),
        ]
        for record in records:
            await jobs.save(record)
        await cluster.storage().steps.save(prepared_step("with-a-step", "s"))
        removed = await cluster.manager().cleanup.dead_jobs()
        left = [job.id for job in await cluster.manager().list()]
        return removed, left

    removed, left = run(scenario())
    assert sorted(removed) == ["dead-preparing-job", "dead-preparing-steps"]
    assert sorted(left) == sorted(
        [
            "young",
            "inline-plan",
            "empty-inline-plan",
            "stored-plan",
            "with-a-step",
            "starting",
            "running",
            "failed",
        ]
    )


@pytest.mark.parametrize(
    "options", [JobsOptions(max_parallel_steps=8, max_terminal_jobs_per_cleanup=2)]
)
def test_when_cleaning_up_many_dead_jobs_each_pass_is_bounded_oldest_first(run, cluster, script):
    async def scenario():
        jobs = cluster.storage().jobs
        now = cluster.clock.now()
        for n in range(5):
            created = now - timedelta(hours=10) + timedelta(minutes=n)
            await jobs.save(crafted_job(f"dead-{n}", JobStatus.PREPARING_JOB, created))
        manager = cluster.manager()
        return [sorted(await manager.cleanup.dead_jobs()) for _ in range(4)]

    passes = run(scenario())
    assert passes == [["dead-0", "dead-1"], ["dead-2", "dead-3"], ["dead-4"], []]


def test_when_cleaning_up_dead_jobs_a_job_stuck_in_preparing_state_is_removed(run, cluster, script):
    """Integration `when_cleaning_up_dead_jobs/a_job_stuck_in_preparing_state`."""

    async def scenario():
        start = asyncio.ensure_future(
            cluster.start(StuckPreparingJob, request("a"), job_id="stuck")
        )
        await cluster.settle()
        before = await stored(cluster, "stuck")
        await cluster.crash()
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await start
        manager = cluster.manager()
        too_early = await manager.cleanup.dead_jobs()
        await cluster.advance(HOUR + 1)
        drain = await manager.rehydrate()  # rehydration cleans up first
        report = await drain
        return before, too_early, report, await stored(cluster, "stuck")

    before, too_early, report, after = run(scenario())
    assert before is not None and before.status == JobStatus.PREPARING_JOB
    assert too_early == []
    assert after is None
    assert "stuck" not in report.queued
    assert script.runs == []


# == cleaning up terminal jobs =================================================================


def test_when_cleaning_up_terminal_jobs_expired_ones_are_removed_steps_first(run, script):
    interceptor = Interceptor()

    async def scenario():
        async with new_cluster(wrap_storage=interceptor.wrap) as cluster:
            script.behaviour["failing"].fail = True
            script.behaviour["unpreparable"].prepare_error = True
            script.behaviour["live"].block = True
            script.behaviour["stopped"].block = True
            for key in ("done", "failing", "unpreparable", "live", "stopped"):
                await cluster.start(ScenarioJob, request(key), job_id=key)
            await cluster.settle()
            await cluster.manager().stop("stopped")
            await cluster.settle()
            await cluster.advance(8 * DAY)
            await cluster.start(ScenarioJob, request("recent"), job_id="recent")
            await cluster.settle()
            statuses = {job.id: job.status for job in await cluster.manager().list()}
            interceptor.calls.clear()
            removed = await cluster.manager().cleanup.terminal_jobs()
            left = [job.id for job in await cluster.manager().list()]
            steps = {key: await steps_of(cluster, key) for key in statuses}
            return statuses, removed, left, steps

    statuses, removed, left, steps = run(scenario())
    assert statuses["done"] == JobStatus.COMPLETED_SUCCESSFULLY
    assert statuses["failing"] == JobStatus.COMPLETED_WITH_FAILURES
    assert statuses["unpreparable"] == JobStatus.FAILED
    assert statuses["live"] == JobStatus.RUNNING
    assert statuses["stopped"] == JobStatus.STOPPED
    assert sorted(removed) == ["done", "failing", "unpreparable"]
    assert sorted(left) == ["live", "recent", "stopped"]
    for job_id in removed:
        assert steps[job_id] == []
        assert interceptor.index_of("steps.remove_all_for_job", job_id) < interceptor.index_of(
            "jobs.remove_terminal", job_id
        )
    assert len(steps["live"]) == 1 and len(steps["stopped"]) == 1


def test_when_cleaning_up_terminal_jobs_a_job_that_is_live_in_storage_is_never_removed(run, script):
    """The page said terminal, storage says running: the conditional delete refuses."""
    interceptor = Interceptor()

    async def stale_page(target: Any, query: JobQuery | None = None) -> list[JobState]:
        if query is not None and query.statuses == TERMINAL_JOB_STATUSES:
            everything = await target(JobQuery(created_before=query.created_before))
            for job in everything:
                job.status = JobStatus.COMPLETED_SUCCESSFULLY
            return everything
        return await target(query)

    async def scenario():
        async with new_cluster(wrap_storage=interceptor.wrap) as cluster:
            script.behaviour["live"].block = True
            await cluster.start(ScenarioJob, request("live"), job_id="live")
            await cluster.settle()
            await cluster.advance(8 * DAY)
            interceptor.hooks["jobs.query"] = stale_page
            removed = await cluster.manager().cleanup.terminal_jobs()
            return removed, await stored(cluster, "live")

    removed, live = run(scenario())
    assert removed == []
    assert live is not None and live.status == JobStatus.RUNNING


@pytest.mark.parametrize(
    "options", [JobsOptions(max_parallel_steps=8, terminal_job_retention="infinite")]
)
def test_when_terminal_job_retention_is_off_every_job_is_kept(run, cluster, script):
    async def scenario():
        await cluster.start(ScenarioJob, request("done"), job_id="done")
        await cluster.settle()
        await cluster.advance(400 * DAY)
        report = await cluster.manager().cleanup.run()
        return report, await stored(cluster, "done")

    report, state = run(scenario())
    assert cluster.options.terminal_job_retention is None
    assert report.terminal_jobs_removed == []
    assert report.errors == []
    assert state is not None and state.status == JobStatus.COMPLETED_SUCCESSFULLY


@pytest.mark.parametrize(
    "options", [JobsOptions(max_parallel_steps=8, max_terminal_jobs_per_cleanup=2)]
)
def test_when_cleaning_up_terminal_jobs_with_more_jobs_than_the_cleanup_page_each_pass_takes_a_page(
    run, cluster, script
):
    async def scenario():
        for n in range(5):
            await cluster.start(ScenarioJob, request(f"k{n}"), job_id=f"done-{n}")
            await cluster.advance(60)
        await cluster.advance(8 * DAY)
        manager = cluster.manager()
        passes = [sorted(await manager.cleanup.terminal_jobs()) for _ in range(4)]
        return passes, await manager.list()

    passes, left = run(scenario())
    assert passes == [["done-0", "done-1"], ["done-2", "done-3"], ["done-4"], []]
    assert left == []


# == each cleanup isolated from the other's failure ============================================


async def _dead_and_expired(cluster: InProcessCluster) -> None:
    """One dead job and one expired completed job."""
    await cluster.start(ScenarioJob, request("done"), job_id="expired")
    await cluster.settle()
    await cluster.advance(8 * DAY)
    old = cluster.clock.now() - timedelta(hours=2)
    await cluster.storage().jobs.save(crafted_job("dead", JobStatus.PREPARING_JOB, old))


def _failing_query(statuses: frozenset[JobStatus]) -> Hook:
    async def hook(target: Any, query: JobQuery | None = None) -> list[JobState]:
        if query is not None and query.statuses == statuses:
            raise StorageUnavailableError("injected: the query failed")
        return await target(query)

    return hook


def test_when_dead_job_cleanup_fails_terminal_job_cleanup_still_runs(run, script):
    interceptor = Interceptor()

    async def scenario():
        async with new_cluster(wrap_storage=interceptor.wrap) as cluster:
            await _dead_and_expired(cluster)
            interceptor.hooks["jobs.query"] = _failing_query(PREPARING_JOB_STATUSES)
            report = await cluster.manager().cleanup.run()
            return report, await stored(cluster, "dead"), await stored(cluster, "expired")

    report, dead, expired = run(scenario())
    assert report.terminal_jobs_removed == ["expired"]
    assert expired is None
    assert dead is not None
    assert len(report.errors) == 1


def test_when_terminal_job_cleanup_fails_dead_job_cleanup_still_runs(run, script):
    interceptor = Interceptor()

    async def scenario():
        async with new_cluster(wrap_storage=interceptor.wrap) as cluster:
            await _dead_and_expired(cluster)
            interceptor.hooks["jobs.query"] = _failing_query(TERMINAL_JOB_STATUSES)
            report = await cluster.manager().cleanup.run()
            return report, await stored(cluster, "dead"), await stored(cluster, "expired")

    report, dead, expired = run(scenario())
    assert report.dead_jobs_removed == ["dead"]
    assert dead is None
    assert expired is not None
    assert len(report.errors) == 1


def test_when_removing_one_expired_job_fails_the_others_are_still_removed(run, script):
    interceptor = Interceptor()

    async def failing_for_one(target: Any, job_id: str) -> int:
        if job_id == "done-1":
            raise StorageUnavailableError("injected: could not remove the steps")
        return await target(job_id)

    async def scenario():
        async with new_cluster(wrap_storage=interceptor.wrap) as cluster:
            for n in range(3):
                await cluster.start(ScenarioJob, request(f"k{n}"), job_id=f"done-{n}")
            await cluster.settle()
            await cluster.advance(8 * DAY)
            interceptor.hooks["steps.remove_all_for_job"] = failing_for_one
            report = await cluster.manager().cleanup.run()
            return report, [job.id for job in await cluster.manager().list()]

    report, left = run(scenario())
    assert sorted(report.terminal_jobs_removed) == ["done-0", "done-2"]
    assert left == ["done-1"]
    assert len(report.errors) == 1


def test_when_cleanup_fails_rehydration_still_resumes_interrupted_jobs(run, script):
    interceptor = Interceptor()

    async def scenario():
        async with new_cluster(wrap_storage=interceptor.wrap) as cluster:
            [job_id] = await interrupt(cluster, script, ["a"])
            interceptor.hooks["jobs.query"] = _failing_query(PREPARING_JOB_STATUSES)
            report = await (await cluster.manager().rehydrate())
            await cluster.settle()
            script.release("a")
            return job_id, report, await cluster.wait(job_id)

    job_id, report, state = run(scenario())
    assert report.resumed == [job_id]
    assert script.ran("a") == 2
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


# == scheduled cleanup =========================================================================

SCHEDULED = JobsOptions(
    max_parallel_steps=8, cleanup_cadence=timedelta(minutes=10), terminal_job_retention=HOUR
)


def _terminal_queries(interceptor: Interceptor) -> int:
    return sum(
        1
        for name, args in interceptor.calls
        if name == "jobs.query" and args and args[0].statuses == TERMINAL_JOB_STATUSES
    )


def test_after_rehydration_cleanup_runs_every_cadence_and_expires_terminal_jobs(run, script):
    interceptor = Interceptor()

    async def scenario():
        async with new_cluster(SCHEDULED, wrap_storage=interceptor.wrap) as cluster:
            await cluster.start(ScenarioJob, request("done"), job_id="done")
            await cluster.settle()
            await (await cluster.manager().rehydrate())  # cleans up once, then every cadence
            rounds = [_terminal_queries(interceptor)]
            await cluster.advance(9 * 60)  # not a cadence yet
            rounds.append(_terminal_queries(interceptor))
            await cluster.advance(60 + 5 * 10 * 60)  # five cadences: within the retention
            rounds.append(_terminal_queries(interceptor))
            kept = await stored(cluster, "done")
            await cluster.advance(2 * 10 * 60)  # past the retention
            return rounds, kept, await stored(cluster, "done")

    rounds, kept, expired = run(scenario())
    assert rounds == [1, 1, 7]
    assert kept is not None and kept.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert expired is None


def test_a_scheduled_cleanup_that_fails_is_tried_again_at_the_next_cadence(run, script):
    interceptor = Interceptor()

    async def scenario():
        async with new_cluster(SCHEDULED, wrap_storage=interceptor.wrap) as cluster:
            await cluster.start(ScenarioJob, request("done"), job_id="done")
            await cluster.settle()
            await (await cluster.manager().rehydrate())
            await cluster.advance(HOUR + 10 * 60 - 1)  # expired, the next round not due
            interceptor.hooks["jobs.query"] = _failing_query(TERMINAL_JOB_STATUSES)
            await cluster.advance(1)  # this round fails
            failed = await stored(cluster, "done")
            del interceptor.hooks["jobs.query"]
            await cluster.advance(10 * 60)
            return failed, await stored(cluster, "done")

    failed, after = run(scenario())
    assert failed is not None
    assert after is None


def test_when_the_manager_closes_scheduled_cleanup_stops(run, script):
    interceptor = Interceptor()

    async def scenario():
        async with new_cluster(SCHEDULED, wrap_storage=interceptor.wrap) as cluster:
            await cluster.start(ScenarioJob, request("done"), job_id="done")
            await cluster.settle()
            await (await cluster.manager().rehydrate())
            cluster.manager().close()
            before = _terminal_queries(interceptor)
            await cluster.advance(2 * HOUR)
            return before, _terminal_queries(interceptor), await stored(cluster, "done")

    before, after, kept = run(scenario())
    assert after == before
    assert kept is not None


# == recovery is handed to the manager ==========================================================


class _RecordingRecovery:
    def __init__(self, manager: Any) -> None:
        self.calls: list[str] = []

    async def rehydrate(self) -> asyncio.Task[Any]:
        self.calls.append("rehydrate")
        return asyncio.get_running_loop().create_task(asyncio.sleep(0))

    def recover_later(self, job_id: str) -> None:
        self.calls.append(f"recover_later {job_id}")

    def close(self) -> None:
        self.calls.append("close")


def test_a_manager_uses_the_recovery_it_is_handed(run, cluster):
    from choreography_ray.engine.manager import JobsManager

    made: list[_RecordingRecovery] = []

    def recovery(manager: JobsManager) -> _RecordingRecovery:
        made.append(_RecordingRecovery(manager))
        return made[-1]

    async def scenario():
        manager = JobsManager(cluster.manager().ctx, recovery=recovery)
        await (await manager.rehydrate())
        manager.close()
        return made[0].calls

    assert run(scenario()) == ["rehydrate", "close"]


# == rehydration ===============================================================================


def test_when_rehydrating_interrupted_jobs_are_resumed_and_their_steps_run_again(
    run, cluster, script
):
    async def scenario():
        ids = await interrupt(cluster, script, ["a", "b"])
        report = await (await cluster.manager().rehydrate())
        await cluster.settle()
        ran = {key: script.ran(key) for key in ("a", "b")}
        script.release("a", "b")
        return ids, report, ran, [await cluster.wait(job_id) for job_id in ids]

    ids, report, ran, states = run(scenario())
    assert report.queued == ids
    assert sorted(report.resumed) == sorted(ids)
    assert report.failed == [] and report.skipped == []
    assert ran == {"a": 2, "b": 2}
    assert all(state.status == JobStatus.COMPLETED_SUCCESSFULLY for state in states)


def test_when_rehydrating_a_backlog_it_returns_before_the_drain_finishes(run, script):
    interceptor = Interceptor()
    reread = asyncio.Event()

    async def held_find(target: Any, job_id: str) -> Any:
        await reread.wait()
        return await target(job_id)

    async def scenario():
        async with new_cluster(wrap_storage=interceptor.wrap) as cluster:
            [job_id] = await interrupt(cluster, script, ["a"])
            interceptor.hooks["jobs.find"] = held_find
            drain = await cluster.manager().rehydrate()
            await cluster.settle()
            returned_early = not drain.done()
            ran_before = script.ran("a")
            reread.set()
            report = await drain
            await cluster.settle()
            ran_after = script.ran("a")
            script.release("a")
            return job_id, returned_early, ran_before, report, ran_after, await cluster.wait(job_id)

    job_id, returned_early, ran_before, report, ran_after, state = run(scenario())
    assert returned_early
    assert ran_before == 1
    assert report.resumed == [job_id]
    assert ran_after == 2
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


@pytest.mark.parametrize(
    ("options", "jobs", "limit"),
    [
        (JobsOptions(max_parallel_steps=16, max_concurrent_rehydration=2), 5, 2),
        (JobsOptions(max_parallel_steps=16), 10, 8),
    ],
    ids=["limit-2", "default-limit"],
)
def test_when_rehydrating_more_jobs_than_the_concurrency_limit_at_most_the_limit_recover_at_once(
    run, cluster, script, resumes, jobs, limit
):
    async def scenario():
        keys = [f"j{n:02d}" for n in range(jobs)]
        await interrupt(cluster, script, keys, job_type=GatedResumeJob)
        resumes.hold = True
        drain = await cluster.manager().rehydrate()
        await cluster.settle()
        seen = [resumes.active]
        released: list[str] = []
        while len(released) < jobs:
            waiting = [job_id for job_id in resumes.order if job_id not in released]
            assert waiting, "no recovery is waiting, yet not every job was resumed"
            resumes.release(waiting[0])
            released.append(waiting[0])
            await cluster.settle()
            seen.append(resumes.active)
        report = await drain
        script.release(*keys)
        await cluster.settle()
        return keys, seen, report

    keys, seen, report = run(scenario())
    assert seen[0] == limit
    assert resumes.peak == limit
    assert max(seen) == limit
    assert sorted(report.resumed) == keys
    assert resumes.order == keys  # every job resumed once, oldest first


@pytest.mark.parametrize(
    "options", [JobsOptions(max_parallel_steps=8, max_concurrent_rehydration=1)]
)
def test_when_rehydrating_jobs_are_resumed_oldest_first(run, cluster, script, resumes):
    async def scenario():
        ids = await interrupt(
            cluster, script, ["c", "a", "d", "b"], job_type=GatedResumeJob, spacing=60
        )
        await (await cluster.manager().rehydrate())
        script.release(*ids)
        await cluster.settle()
        return ids

    ids = run(scenario())
    assert ids == ["c", "a", "d", "b"]
    assert resumes.order == ["c", "a", "d", "b"]


def test_when_rehydrating_and_one_job_fails_the_others_are_still_resumed(
    run, cluster, script, resumes
):
    async def scenario():
        ids = await interrupt(cluster, script, ["a", "broken", "b"], job_type=GatedResumeJob)
        resumes.fail.add("broken")
        # and one job an earlier process left preparing without a plan: it cannot be resumed
        created = cluster.clock.now() - timedelta(minutes=5)
        await cluster.storage().jobs.save(
            crafted_job("planless", JobStatus.PREPARING_STEPS, created)
        )
        report = await (await cluster.manager().rehydrate())
        await cluster.settle()
        script.release("a", "b", "broken")
        return ids, report, {job_id: await cluster.wait(job_id) for job_id in ("a", "b")}

    _, report, states = run(scenario())
    assert report.queued[0] == "planless"
    assert sorted(report.failed) == ["broken", "planless"]
    assert sorted(report.resumed) == ["a", "b"]
    assert all(state.status == JobStatus.COMPLETED_SUCCESSFULLY for state in states.values())


def test_when_rehydrating_with_an_unregistered_job_type_it_is_skipped_and_the_rest_continue(
    run, cluster, script
):
    async def scenario():
        [job_id] = await interrupt(cluster, script, ["a"])
        stranger = crafted_job(
            "stranger",
            JobStatus.RUNNING,
            cluster.clock.now() - timedelta(minutes=5),
            job_type="tests.manager.never-registered-job",
        )
        await cluster.storage().jobs.save(stranger)
        report = await (await cluster.manager().rehydrate())
        await cluster.settle()
        script.release("a")
        return job_id, report, await cluster.wait(job_id)

    job_id, report, state = run(scenario())
    assert report.resumed == [job_id]
    assert "stranger" not in report.resumed
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


@pytest.mark.parametrize(
    "options", [JobsOptions(max_parallel_steps=8, max_concurrent_rehydration=1)]
)
def test_when_queued_jobs_are_no_longer_interrupted_they_are_skipped_at_dispatch(
    run, cluster, script, resumes
):
    async def scenario():
        await interrupt(cluster, script, ["first"], job_type=GatedResumeJob)
        await interrupt(cluster, script, ["queued"])
        resumes.hold = True
        manager = cluster.manager()
        drain = await manager.rehydrate()
        await cluster.settle()
        assert resumes.order == ["first"]
        # While "queued" waits for its turn, someone resumes it and it completes.
        assert await manager.resume("queued") == ResumeJobSuccess.SUCCESS
        script.release("queued")
        await cluster.settle()
        completed = await stored(cluster, "queued")
        resumes.release("first")
        report = await drain
        script.release("first")
        await cluster.settle()
        return completed, report

    completed, report = run(scenario())
    assert completed.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert report.skipped == ["queued"]
    assert report.resumed == ["first"]
    assert script.ran("queued") == 2  # the crashed run and the explicit resume; no third
    assert hook_count(script, "on_before_resuming_job_steps") == 2


@pytest.mark.parametrize(
    "options", [JobsOptions(max_parallel_steps=8, max_concurrent_rehydration=1)]
)
def test_when_stopping_a_job_queued_for_rehydration_the_stop_wins(run, cluster, script, resumes):
    async def scenario():
        await interrupt(cluster, script, ["first"], job_type=GatedResumeJob)
        await interrupt(cluster, script, ["queued"])
        resumes.hold = True
        manager = cluster.manager()
        drain = await manager.rehydrate()
        await cluster.settle()
        await manager.stop("queued")
        await cluster.settle()
        resumes.release("first")
        report = await drain
        script.release("first", "queued")
        await cluster.settle()
        return report, await stored(cluster, "queued")

    report, queued = run(scenario())
    assert "queued" not in report.resumed
    assert report.resumed == ["first"]
    assert queued.status == JobStatus.STOPPED
    assert queued.stop_finalized
    assert script.ran("queued") == 1
    assert hook_count(script, "on_before_resuming_job_steps") == 1  # "first" only
    assert hook_count(script, "on_stopped") == 1


def test_when_rehydrating_while_a_drain_is_in_progress_the_call_shares_it(
    run, cluster, script, resumes
):
    async def scenario():
        ids = await interrupt(cluster, script, ["a", "b"], job_type=GatedResumeJob)
        resumes.hold = True
        manager = cluster.manager()
        first = await manager.rehydrate()
        await cluster.settle()
        second = await manager.rehydrate()
        for job_id in ids:
            resumes.release(job_id)
        report = await first
        script.release(*ids)
        await cluster.settle()
        return ids, first, second, report

    ids, first, second, report = run(scenario())
    assert second is first
    assert sorted(report.resumed) == ids
    assert sorted(resumes.order) == ids  # each job resumed once
    assert script.ran("a") == script.ran("b") == 2


def test_when_rehydrating_while_preparation_is_in_progress_the_calls_share_it(run, script):
    interceptor = Interceptor()
    loaded = asyncio.Event()

    async def held_load(target: Any, statuses: Any) -> list[JobState]:
        await loaded.wait()
        return await target(statuses)

    async def scenario():
        async with new_cluster(wrap_storage=interceptor.wrap) as cluster:
            ids = await interrupt(cluster, script, ["a", "b"])
            interceptor.hooks["jobs.get_jobs_excluding_finalized_stops"] = held_load
            interceptor.calls.clear()
            manager = cluster.manager()
            one = asyncio.ensure_future(manager.rehydrate())
            await cluster.settle()
            two = asyncio.ensure_future(manager.rehydrate())
            await cluster.settle()
            loaded.set()
            first, second = await one, await two
            report = await first
            await cluster.settle()
            loads = interceptor.names().count("jobs.get_jobs_excluding_finalized_stops")
            ran = {key: script.ran(key) for key in ids}
            script.release(*ids)
            await cluster.settle()
            return ids, first, second, report, loads, ran

    ids, first, second, report, loads, ran = run(scenario())
    assert second is first, "an overlapping rehydrate started a second drain"
    assert loads == 1
    assert sorted(report.resumed) == ids
    assert ran == {"a": 2, "b": 2}


def test_when_rehydrating_again_after_a_drain_completes_a_new_pass_runs(run, cluster, script):
    async def scenario():
        [job_id] = await interrupt(cluster, script, ["a"])
        manager = cluster.manager()
        first = await manager.rehydrate()
        first_report = await first
        await cluster.settle()
        # A job an earlier process left running shows up after the first pass.
        created = cluster.clock.now() - timedelta(minutes=1)
        await cluster.storage().jobs.save(crafted_job("late", JobStatus.RUNNING, created))
        second = await manager.rehydrate()
        second_report = await second
        await cluster.settle()
        script.release("a")
        return job_id, first, first_report, second, second_report, await cluster.wait(job_id)

    job_id, first, first_report, second, second_report, state = run(scenario())
    assert second is not first
    assert first_report.resumed == [job_id]
    assert "late" in second_report.queued
    assert "late" in second_report.resumed
    # the job resumed by the first pass still runs: it is checked, not started twice
    assert job_id in second_report.skipped
    assert script.ran("a") == 2
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_when_rehydrating_a_stopped_job_whose_stop_was_not_finalized_the_stop_is_finished(
    run, cluster, script
):
    async def scenario():
        [job_id] = await interrupt(cluster, script, ["a"])
        await restatus(cluster, job_id, JobStatus.STOPPED)
        manager = cluster.manager()
        first = await (await manager.rehydrate())
        await cluster.settle()
        state = await stored(cluster, job_id)
        second = await (await manager.rehydrate())
        await cluster.settle()
        return job_id, first, state, second

    job_id, first, state, second = run(scenario())
    assert first.finished_stops == [job_id]
    assert first.resumed == []
    assert state.status == JobStatus.STOPPED
    assert state.stop_finalized
    assert state.progress.stopped_steps == 1
    assert hook_count(script, "on_stopped") == 1
    assert hook_count(script, "on_before_resuming_job_steps") == 0
    assert script.ran("a") == 1
    assert job_id not in second.queued  # a finalized stop is left alone


def test_when_rehydrating_a_job_being_removed_the_removal_is_finished_and_the_job_cleared(
    run, cluster, script
):
    async def scenario():
        [job_id] = await interrupt(cluster, script, ["a"])
        await restatus(cluster, job_id, JobStatus.REMOVING)
        report = await (await cluster.manager().rehydrate())
        await cluster.settle()
        return job_id, report, await stored(cluster, job_id), await steps_of(cluster, job_id)

    job_id, report, state, steps = run(scenario())
    assert report.finished_stops == [job_id]
    assert report.resumed == []
    assert state is None
    assert steps == []
    assert hook_count(script, "on_stopped") == 1
    assert hook_count(script, "on_before_resuming_job_steps") == 0
    assert script.ran("a") == 1


# == integration: a job with a single step =====================================================


def test_when_starting_a_job_with_a_single_step_and_the_step_completes_successfully(
    run, cluster, script
):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        return result, await cluster.wait(result.job_id), await steps_of(cluster, result.job_id)

    result, state, steps = run(scenario())
    assert result.error is None
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.total_steps == state.progress.successful_steps == 1
    assert [s.status for s in steps] == [JobStepStatus.COMPLETED_SUCCESSFULLY]
    assert hook_count(script, "on_all_steps_completed") == 1
    assert [o.status for o in script.outcomes] == [JobStepStatus.COMPLETED_SUCCESSFULLY]
    assert script.outcomes[0].result.value == 1


def test_when_starting_a_job_with_a_single_step_and_the_step_fails(run, cluster, script):
    async def scenario():
        script.behaviour["a"].fail = True
        result = await cluster.start(ScenarioJob, request("a"))
        return result, await cluster.wait(result.job_id), await steps_of(cluster, result.job_id)

    result, state, steps = run(scenario())
    assert result.error is None
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 1
    assert [s.status for s in steps] == [JobStepStatus.COMPLETED_WITH_FAILURE]
    assert steps[0].error is not None and "step a failed" in steps[0].error.messages
    assert hook_count(script, "on_all_steps_completed") == 1


def test_when_starting_a_job_with_a_single_step_and_the_step_fails_and_keep_state_is_false(
    run, cluster, script
):
    async def scenario():
        script.behaviour["a"].fail = True
        result = await cluster.start(ClearingJob, request("a"))
        return await cluster.wait(result.job_id), await steps_of(cluster, result.job_id)

    state, steps = run(scenario())
    assert state is None
    assert steps == []
    assert hook_count(script, "on_all_steps_completed") == 1


def test_when_starting_a_job_with_a_single_step_and_the_job_is_stopped(run, cluster, script):
    async def scenario():
        script.behaviour["a"].block = True
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        return await cluster.wait(result.job_id), await steps_of(cluster, result.job_id)

    state, steps = run(scenario())
    assert state.status == JobStatus.STOPPED
    assert state.stop_finalized
    assert state.progress.stopped_steps == 1
    assert [s.status for s in steps] == [JobStepStatus.STOPPED]
    assert [o.status for o in script.outcomes] == [JobStepStatus.STOPPED]
    assert hook_count(script, "on_stopped") == 1
    assert hook_count(script, "on_all_steps_completed") == 0


def test_when_starting_a_job_with_a_single_step_and_the_job_is_stopped_and_then_resumed(
    run, cluster, script
):
    async def scenario():
        script.behaviour["a"].block = True
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        manager = cluster.manager()
        await manager.stop(result.job_id)
        await cluster.settle()
        script.release("a")
        answer = await manager.resume(result.job_id)
        return answer, await cluster.wait(result.job_id)

    answer, state = run(scenario())
    assert answer == ResumeJobSuccess.SUCCESS
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 1
    assert state.progress.stopped_steps == 0
    assert script.ran("a") == 2
    assert hook_count(script, "on_stopped") == 1
    assert hook_count(script, "on_all_steps_completed") == 1


def test_when_starting_a_job_with_a_single_step_and_the_job_is_stopped_and_then_deleted(
    run, cluster, script
):
    async def scenario():
        script.behaviour["a"].block = True
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        manager = cluster.manager()
        await manager.stop(result.job_id)
        await cluster.settle()
        await manager.remove(result.job_id)
        return await cluster.wait(result.job_id), await steps_of(cluster, result.job_id)

    state, steps = run(scenario())
    assert state is None
    assert steps == []
    assert script.ran("a") == 1
    assert 1 <= hook_count(script, "on_stopped") <= 2  # on stop, and possibly again on removal


def test_when_starting_a_job_with_a_single_step_and_the_job_is_deleted(run, cluster, script):
    async def scenario():
        script.behaviour["a"].block = True
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().remove(result.job_id)
        state = await cluster.wait(result.job_id)
        script.release("a")
        await cluster.settle()
        return result.job_id, state, await steps_of(cluster, result.job_id)

    _, state, steps = run(scenario())
    assert state is None
    assert steps == []
    assert script.ran("a") == 1
    assert hook_count(script, "on_stopped") == 1
    assert hook_count(script, "on_all_steps_completed") == 0


def test_when_starting_a_job_with_a_single_step_and_then_resumed_while_it_runs(
    run, cluster, script
):
    async def scenario():
        script.behaviour["a"].block = True
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        answer = await cluster.manager().resume(result.job_id)
        await cluster.settle()
        script.release("a")
        return answer, await cluster.wait(result.job_id)

    answer, state = run(scenario())
    assert answer == ResumeJobSuccess.JOB_ALREADY_RUNNING
    assert script.ran("a") == 1
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_when_starting_a_job_with_a_single_step_and_resuming_the_successfully_completed_job(
    run, cluster, script
):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        answer = await cluster.manager().resume(result.job_id)
        return answer, await cluster.wait(result.job_id)

    answer, state = run(scenario())
    assert answer == ResumeJobSuccess.JOB_IS_COMPLETED
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert script.ran("a") == 1
    assert hook_count(script, "on_all_steps_completed") == 1


@pytest.mark.parametrize("turns", range(8))
def test_when_starting_a_single_step_job_and_it_is_stopped_while_its_step_reports_a_failure(
    run, cluster, script, turns
):
    """However the stop and the failure report interleave, neither waits for the other and
    the step's end is counted exactly once; a stop that won ends finalized."""

    async def scenario():
        script.behaviour["a"].block = True
        script.behaviour["a"].fail = True
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        script.release("a")
        for _ in range(turns):
            await asyncio.sleep(0)
        stopping = asyncio.ensure_future(cluster.manager().stop(result.job_id))
        await cluster.settle()
        assert stopping.done(), "the stop waits on the step's report: a deadlock"
        refused = stopping.exception()
        state = await cluster.wait(result.job_id)
        return refused, state, await steps_of(cluster, result.job_id)

    refused, state, steps = run(scenario())
    progress = state.progress
    assert progress.failed_steps + progress.stopped_steps == 1, progress
    assert len(script.outcomes) == 1
    if refused is not None:
        assert isinstance(refused, StopJobFailed), refused
        assert refused.code == StopJobError.JOB_IS_COMPLETED
        assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    else:
        assert state.status == JobStatus.STOPPED
        assert state.stop_finalized, f"the stop never finished: {progress}, steps {steps}"
        assert hook_count(script, "on_stopped") == 1


def test_when_rehydrating_after_the_host_has_stopped_nothing_runs(run, script):
    from choreography_ray.jobs import ShuttingDownError

    async def scenario():
        async with new_cluster() as cluster:
            [job_id] = await interrupt(cluster, script, ["a"])
            manager = cluster.manager()
            manager.close()
            with pytest.raises(ShuttingDownError):
                await manager.rehydrate()
            return await cluster.storage().jobs.get(job_id)

    state = run(scenario())
    assert script.ran("a") == 1
    assert state.status == JobStatus.RUNNING  # left for the next host to recover


def test_when_the_host_stops_during_rehydration_jobs_not_yet_resumed_stay_for_the_next_pass(
    run, script
):
    interceptor = Interceptor()
    reread = asyncio.Event()

    async def held_find(target: Any, job_id: str) -> Any:
        await reread.wait()
        return await target(job_id)

    async def scenario():
        async with new_cluster(wrap_storage=interceptor.wrap) as cluster:
            [job_id] = await interrupt(cluster, script, ["a"])
            interceptor.hooks["jobs.find"] = held_find
            manager = cluster.manager()
            drain = await manager.rehydrate()
            await cluster.settle()
            manager.close()  # the host stops while the job waits in the drain
            reread.set()
            with pytest.raises(asyncio.CancelledError):
                await drain
            await cluster.settle()
            ran = script.ran("a")
            # The next host finds the job where it was, and recovers it.
            del interceptor.hooks["jobs.find"]
            await cluster.crash()
            script.release("a")
            await (await cluster.manager().rehydrate())
            return ran, await cluster.wait(job_id)

    ran, state = run(scenario())
    assert ran == 1
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


# -- waiting for a job to finish ----------------------------------------------------------------


def test_waiting_for_a_running_job_returns_as_soon_as_it_finishes(run, cluster, script):
    async def scenario():
        script.behaviour["a"].block = True
        started = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        waiting = asyncio.ensure_future(cluster.manager().wait_finished(started.job_id, HOUR))
        await cluster.settle()
        before = waiting.done()
        script.release("a")
        await cluster.settle()
        return before, waiting.done(), waiting.result() if waiting.done() else None

    before, after, state = run(scenario())
    assert (before, after) == (False, True)  # no clock advanced: woken by the job's own write
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_waiting_returns_the_state_as_it_stands_when_the_time_given_passes(run, cluster, script):
    async def scenario():
        script.behaviour["a"].block = True
        started = await cluster.start(ScenarioJob, request("a"))
        waiting = asyncio.ensure_future(cluster.manager().wait_finished(started.job_id, 5.0))
        await cluster.advance(4.9)
        early = waiting.done()
        await cluster.advance(0.1)
        state = waiting.result() if waiting.done() else None
        script.release("a")
        await cluster.wait(started.job_id)
        return early, state

    early, state = run(scenario())
    assert early is False
    assert state is not None and state.status == JobStatus.RUNNING


def test_waiting_for_a_job_that_is_cleared_or_unknown_returns_none(run, cluster):
    async def scenario():
        cleared = await cluster.start(ClearingJob, request("a"))
        await cluster.wait(cleared.job_id)
        manager = cluster.manager()
        return (
            await manager.wait_finished(cleared.job_id, HOUR),
            await manager.wait_finished("no-such-job", HOUR),
        )

    assert run(scenario()) == (None, None)


def test_waiting_for_a_job_another_host_runs_reads_it_again_until_it_finishes(run, cluster, script):
    async def scenario():
        script.behaviour["a"].block = True
        started = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.crash()  # this manager no longer runs the job
        waiting = asyncio.ensure_future(cluster.manager().wait_finished(started.job_id, HOUR))
        await cluster.settle()
        storage = cluster.storage().jobs
        state = await storage.get(started.job_id)
        state.status = JobStatus.COMPLETED_SUCCESSFULLY  # as the host that runs it would
        await storage.save(state)
        await cluster.settle()
        unseen = waiting.done()
        await cluster.advance(0.25)
        return unseen, waiting.result() if waiting.done() else None

    unseen, state = run(scenario())
    assert unseen is False
    assert state is not None and state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_cleanup_deletes_stored_plans_no_job_needs_and_keeps_the_rest(run, script):
    """A plan is orphaned when its job is gone, durably terminal or a finalized stop, or when
    the job has moved on to a newer incarnation; a running job's current plan stays."""
    now = datetime(2026, 1, 1, tzinfo=UTC)

    def job(job_id: str, status: JobStatus, incarnation: int, **fields: Any) -> JobState:
        state = crafted_job(job_id, status, now, has_stored_step_plan=True)
        return state.model_copy(update={"stored_step_plan_incarnation": incarnation, **fields})

    async def scenario():
        async with new_cluster() as cluster:
            storage = cluster.storage()
            plan = [planned_step("a")]
            for record in (
                job("running", JobStatus.RUNNING, 2),
                job("done", JobStatus.COMPLETED_SUCCESSFULLY, 1),
                job("stopped", JobStatus.STOPPED, 1, stop_finalized=True),
                job("stopping", JobStatus.STOPPED, 1, stop_finalized=False),
            ):
                await storage.jobs.save(record)
            for job_id, incarnation in (
                ("running", 1),
                ("running", 2),
                ("done", 1),
                ("stopped", 1),
                ("stopping", 1),
                ("gone", 3),
            ):
                await storage.plans.save_plan(job_id, incarnation, plan)
            report = await cluster.manager().cleanup.run()
            return report, await storage.plans.stored_plans(take=100)

    report, left = run(scenario())
    assert sorted(report.plans_removed) == [
        ("done", 1),
        ("gone", 3),
        ("running", 1),
        ("stopped", 1),
    ]
    assert left == [("running", 2), ("stopping", 1)]
