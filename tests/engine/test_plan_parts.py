"""A plan too large to hold whole: saved a part at a time as it is built, and its steps
prepared from plan storage a part at a time (issue 23: a million-step plan held whole took
about 840 bytes a step in the controller host)."""

from __future__ import annotations

import gc
import weakref

import pytest

from choreography_ray.engine import planning, starting
from choreography_ray.jobs import JobsOptions, JobStatus, StartJobError
from choreography_ray.jobs.registry import Payload
from choreography_ray.jobs.state import PlannedStep
from choreography_ray.storage import memory
from choreography_ray.storage.protocols import JobsStorage
from choreography_ray.testing import InProcessCluster

from ..storage.support import whole_plan
from .fixtures import KeyRequest, KeyStep, ScenarioJob, request

KEYS = [f"k{n:02}" for n in range(11)]


class PlanParts:
    """Wraps plan storage: records each plan write and read, and how many entries of the
    parts saved earlier are still alive in memory when the next part is saved."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, int, int]] = []  # (call, position, entries)
        self.read_parts: list[int] = []
        self.alive_before_part: list[int] = []
        self._saved: list[weakref.ref[PlannedStep]] = []

    def wrap(self, storage: JobsStorage) -> JobsStorage:
        parts, plans = self, storage.plans

        class Plans:
            def __getattr__(self, name):
                return getattr(plans, name)

            async def save_plan(self, job_id, incarnation, steps):
                parts._saving("save", 0, steps)
                return await plans.save_plan(job_id, incarnation, steps)

            async def append_plan(self, job_id, incarnation, position, steps):
                parts._saving("append", position, steps)
                return await plans.append_plan(job_id, incarnation, position, steps)

            async def plan_parts(self, job_id, incarnation):
                async for part in plans.plan_parts(job_id, incarnation):
                    parts.read_parts.append(len(part))
                    yield part

        return JobsStorage(storage.key, storage.jobs, storage.steps, Plans())

    def _saving(self, call: str, position: int, steps: list[PlannedStep]) -> None:
        gc.collect()
        self.alive_before_part.append(sum(ref() is not None for ref in self._saved))
        self._saved.extend(weakref.ref(planned) for planned in steps)
        self.writes.append((call, position, len(steps)))


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of two entries built, of four read back, and a plan of more than four held
    whole no longer."""
    monkeypatch.setattr(planning, "PLAN_CHUNK", 2)
    monkeypatch.setattr(memory, "PLAN_PART", 4)
    monkeypatch.setattr(planning, "ORIGINALS_KEPT", 4)
    monkeypatch.setattr(starting, "ORIGINALS_KEPT", 4)


def _cluster(parts: PlanParts) -> InProcessCluster:
    """Every plan stored apart; entered with `async with`, which initializes and closes it."""
    return InProcessCluster(
        options=JobsOptions(max_inline_step_plan_size=0, max_parallel_steps=4),
        wrap_storage=parts.wrap,
    )


def test_a_large_plan_is_saved_a_part_at_a_time_and_never_held_whole(run, script, small_parts):
    parts = PlanParts()

    async def scenario():
        async with _cluster(parts) as cluster:
            result = await cluster.start(ScenarioJob, request(*KEYS))
            final = await cluster.wait(result.job_id)
            steps = await cluster.storage().steps.get_for_job(result.job_id)
            return result, final, steps

    result, final, steps = run(scenario())
    assert result.error is None
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY
    # The first six entries (more than four) decide that it is large; then a part at a time.
    assert parts.writes == [("save", 0, 6), ("append", 6, 2), ("append", 8, 2), ("append", 10, 1)]
    # What was saved is let go before the next part is saved.
    assert parts.alive_before_part == [0, 0, 0, 0]
    # Its steps are prepared from plan storage, a bounded part at a time.
    assert parts.read_parts == [4, 4, 3]
    assert sorted(k for k, _ in script.runs) == KEYS  # each step ran once
    assert final.progress.total_steps == len(KEYS)
    positions = {step.name: step.position for step in steps}
    assert positions == {key: index for index, key in enumerate(KEYS)}


def test_a_plan_of_up_to_the_limit_is_saved_whole_and_prepared_from_memory(
    run, script, small_parts
):
    parts = PlanParts()

    async def scenario():
        async with _cluster(parts) as cluster:
            result = await cluster.start(ScenarioJob, request(*KEYS[:4]))
            return await cluster.wait(result.job_id)

    assert run(scenario()).status == JobStatus.COMPLETED_SUCCESSFULLY
    assert parts.writes == [("save", 0, 4)]
    assert parts.read_parts == []


def test_a_fault_in_a_later_part_fails_the_start_and_deletes_what_was_saved(
    run, script, small_parts
):
    script.plan_override = lambda job, r: [
        job.create_step(KeyStep, KeyRequest(key=key), step_id=key) for key in [*KEYS, "k03"]
    ]
    parts = PlanParts()

    async def scenario():
        async with _cluster(parts) as cluster:
            result = await cluster.start(ScenarioJob, request())
            stored = await cluster.storage().jobs.get(result.job_id)
            left = await cluster.storage().plans.stored_plans(take=10)
            return result, stored, left

    result, stored, left = run(scenario())
    assert result.error == StartJobError.INVALID_STEP_PLAN
    assert "'k03' is planned twice" in result.reason
    assert [call for call, _, _ in parts.writes] == ["save", "append", "append"]
    assert stored.status == JobStatus.FAILED
    assert left == []  # the parts saved before the fault were deleted
    assert script.runs == []


def test_recovery_prepares_a_plan_stored_in_parts_a_part_at_a_time(run, script, small_parts):
    parts = PlanParts()

    async def scenario():
        async with _cluster(parts) as cluster:
            # Crash before any step is prepared: the job is PreparingSteps with its plan stored.
            result = await cluster.start(BackgroundPlan, request(*KEYS))
            await cluster.crash()
            parts.read_parts.clear()
            await (await cluster.manager().rehydrate())
            return result, await cluster.wait(result.job_id)

    result, final = run(scenario())
    assert result.error is None
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert final.progress.total_steps == len(KEYS)
    # Read twice a part at a time: once to know the steps, once to prepare those not stored.
    assert parts.read_parts == [4, 4, 3, 4, 4, 3]
    assert sorted({k for k, _ in script.runs}) == KEYS


def test_a_stored_request_that_does_not_fit_its_class_fails_the_preparation_naming_the_step(
    run, script, small_parts
):
    """Plan storage checks the names of what it reads back, not each request's data: the one
    check of a request is the load that prepares its step, and it names the step."""
    parts = PlanParts()

    async def scenario():
        async with _cluster(parts) as cluster:
            result = await cluster.start(BackgroundPlan, request(*KEYS))
            await cluster.crash()  # PreparingSteps, its plan stored and no step prepared
            job = await cluster.storage().jobs.get(result.job_id)
            plans = cluster.storage().plans
            incarnation = job.stored_step_plan_incarnation
            entries = await whole_plan(plans, result.job_id, incarnation)
            unfit = Payload(type=entries[9].request.type, data={"key": 5})
            entries[9] = entries[9].model_copy(update={"request": unfit})
            await plans.save_plan(result.job_id, incarnation, entries)
            await (await cluster.manager().rehydrate())  # recovery fails the job, once
            return entries[9].step_id, await cluster.storage().jobs.get(result.job_id)

    step_id, stored = run(scenario())
    assert stored.status == JobStatus.FAILED
    reason = " ".join(stored.status_changes[-1].exception_messages)
    assert f"step {step_id!r}" in reason
    assert "does not fit its class" in reason
    assert script.runs == []


class BackgroundPlan(ScenarioJob, name="plan-parts.background-job"):
    """Returns from `start()` once the plan is durable and prepares its steps in a task that a
    crash can interrupt."""

    start_steps_in_background = True
