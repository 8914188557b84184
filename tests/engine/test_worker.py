"""What the worker promises about the runs of one step across executions of its job: one run
per step at a time, a resumed run starts from what the run before it wrote, and a late stop of
an earlier execution never stops a resumed run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from choreography_ray.engine.messages import StartOutcome, StepStart, StopRequest
from choreography_ray.engine.run import StepRun
from choreography_ray.engine.run_host import RunKey
from choreography_ray.engine.writer import Tracked
from choreography_ray.jobs import (
    JobKey,
    JobsOptions,
    JobStatus,
    JobStepStatus,
    ResumeJobSuccess,
    StorageUnavailableError,
)
from choreography_ray.jobs.state import JobStepState, StepLease
from choreography_ray.jobs.step import JobStep, StepCancelled, StepContext
from choreography_ray.testing import InProcessCluster

from .fixtures import KeyRequest, KeyResult, KeyState, ScenarioJob, request, wrap_steps


class Lingering:
    """What `LingeringStep` runs do and when: a run that is asked to stop goes on until
    `finish` is set; a run that is not stopped completes once `go` is set."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.go = asyncio.Event()
        self.finish = asyncio.Event()


LINGERING = Lingering()


@pytest.fixture
def lingering() -> Iterator[Lingering]:
    global LINGERING
    LINGERING = Lingering()
    yield LINGERING
    LINGERING.finish.set()  # a test that failed half-way leaves no run that cannot end


class LingeringStep(JobStep[KeyRequest, KeyState, KeyResult], name="tests.worker.lingering"):
    async def perform(self, state: KeyState, ctx: StepContext) -> KeyResult:
        script = LINGERING
        script.events.append("perform")
        try:
            await script.go.wait()
        except asyncio.CancelledError:
            while not script.finish.is_set():  # slow to stop: every stop waits for `finish`
                try:
                    await script.finish.wait()
                except asyncio.CancelledError:
                    continue
            script.events.append("stopped")
            raise StepCancelled() from None
        script.events.append("completed")
        return KeyResult(key=state.key)

    def initialize_state(self, request: KeyRequest) -> KeyState:
        return KeyState(key=request.key)


class LingeringJob(ScenarioJob, name="tests.worker.lingering-job"):
    def prepare_steps(self, request: Any) -> list[Any]:
        return [self.create_step(LingeringStep, KeyRequest(key=k), name=k) for k in request.keys]


async def resumed_while_the_stopped_run_lingers(cluster: Any, lingering: Lingering) -> str:
    """A job stopped and resumed while its step's first run is still stopping; that run then
    stops, and the resumed run performs. Returns the job id."""
    started = await cluster.start(LingeringJob, request("a"))
    await cluster.settle()
    job_id = started.job_id
    await cluster.manager().stop(job_id)
    await cluster.settle()
    assert await cluster.manager().resume(job_id) == ResumeJobSuccess.SUCCESS
    await cluster.settle()
    assert lingering.events == ["perform"]  # the resumed run waits for the first to stop
    lingering.finish.set()
    await cluster.settle()
    return job_id


def test_a_new_start_waits_for_the_older_run_to_stop_and_starts_from_what_it_wrote(
    run, cluster, script, lingering
):
    async def scenario():
        job_id = await resumed_while_the_stopped_run_lingers(cluster, lingering)
        events = list(lingering.events)
        lingering.go.set()
        state = await cluster.wait(job_id)
        return events, state, await cluster.storage().steps.get_for_job(job_id)

    events, state, [step] = run(scenario())
    assert events == ["perform", "stopped", "perform"]
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.execution_generation == 2
    assert [change.status for change in step.status_changes] == [
        JobStepStatus.RUNNING,
        JobStepStatus.STOPPED,
        JobStepStatus.RUNNING,
        JobStepStatus.COMPLETED_SUCCESSFULLY,
    ]
    assert step.generation == 2


def test_a_late_stop_of_an_earlier_execution_does_not_stop_the_resumed_run(
    run, cluster, script, lingering
):
    async def scenario():
        job_id = await resumed_while_the_stopped_run_lingers(cluster, lingering)
        [step] = await cluster.storage().steps.get_for_job(job_id)
        late = await cluster.worker.stop_steps(
            StopRequest(JobKey(), job_id, generation=1, step_ids=(step.id,))
        )
        await cluster.settle()
        lingering.go.set()
        return step.id, late, await cluster.wait(job_id)

    step_id, late, state = run(scenario())
    assert late.stopping == []
    assert late.not_running == [step_id]
    assert lingering.events == ["perform", "stopped", "perform", "completed"]
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_a_start_that_overtakes_a_pending_stop_is_accepted_and_deferred_by_the_worker(
    run, cluster, script, lingering, monkeypatch
):
    """The stopping seed: a step accepts a resume's start while its earlier run is still
    stopping, and runs it in a turn of its own once that stop has settled. The worker alone
    is tested: reports are kept from the job, so no start is sent again on its behalf."""
    held: list[Any] = []

    async def report(job_key, job_id, reports):
        held.extend(reports)

    async def scenario():
        started = await cluster.start(LingeringJob, request("a"))
        await cluster.settle()
        monkeypatch.setattr(cluster, "report", report)
        job_id = started.job_id
        [step] = await cluster.storage().steps.get_for_job(job_id)
        worker = cluster.worker
        await worker.stop_steps(StopRequest(JobKey(), job_id, generation=1, step_ids=(step.id,)))
        await cluster.settle()
        answers = await worker.start_steps(
            JobKey(), job_id, LingeringJob.name, [StepStart(step.id, generation=2)]
        )
        await cluster.settle()
        before = list(lingering.events)
        lingering.finish.set()  # the first run stops and writes it
        await cluster.settle()
        after = list(lingering.events)
        lingering.go.set()
        await cluster.settle()
        [stored] = await cluster.storage().steps.get_for_job(job_id)
        return answers, before, after, stored, held

    answers, before, after, stored, held = run(scenario())
    assert [answer.outcome for answer in answers] == [StartOutcome.STARTED]
    assert before == ["perform"]  # deferred: the stopping run is the only one
    assert after == ["perform", "stopped", "perform"]
    assert stored.status == JobStepStatus.COMPLETED_SUCCESSFULLY and stored.generation == 2
    assert [(r.status, r.generation) for r in held] == [
        (JobStepStatus.STOPPED, 1),
        (JobStepStatus.COMPLETED_SUCCESSFULLY, 2),
    ]


class CheckpointingStep(JobStep[KeyRequest, KeyState, KeyResult], name="tests.worker.checkpoints"):
    """Checkpoints once `go` is set (written at once), then works until `finish` is set."""

    checkpoint_after_every_batch = True

    async def perform(self, state: KeyState, ctx: StepContext) -> KeyResult:
        script = LINGERING
        script.events.append("perform")
        await script.go.wait()
        state.progress += 1
        ctx.checkpoint(state)
        try:
            await script.finish.wait()
        except asyncio.CancelledError:
            script.events.append("stopped" if ctx.cancelled else "cancelled")
            raise
        script.events.append("completed")
        return KeyResult(key=state.key)

    def initialize_state(self, request: KeyRequest) -> KeyState:
        return KeyState(key=request.key)


class CheckpointingJob(ScenarioJob, name="tests.worker.checkpointing-job"):
    def prepare_steps(self, request: Any) -> list[Any]:
        return [
            self.create_step(CheckpointingStep, KeyRequest(key=k), name=k) for k in request.keys
        ]


def test_a_run_whose_record_changed_under_it_stops_its_work_and_reports_nothing(
    run, cluster, script, lingering
):
    async def scenario():
        started = await cluster.start(CheckpointingJob, request("a"))
        await cluster.settle()
        job_id = started.job_id
        storage = cluster.storage()
        [step] = await storage.steps.get_for_job(job_id)
        elsewhere = StepLease(node="elsewhere", activation="other", heartbeat=cluster.clock.now())
        await storage.steps.save(step.model_copy(update={"lease": elsewhere}))
        [theirs] = await storage.steps.get_for_job(job_id)
        lingering.go.set()  # the run's checkpoint finds the record changed
        await cluster.settle()
        runs = cluster.worker.runs_of(job_id)
        [after] = await storage.steps.get_for_job(job_id)
        return theirs, after, runs, await cluster.manager().get(job_id)

    theirs, after, runs, state = run(scenario())
    assert lingering.events == ["perform", "stopped"]
    assert runs == []
    assert after == theirs  # the other writer's record stands
    assert after.lease is not None and after.lease.node == "elsewhere"
    assert state.status == JobStatus.RUNNING  # nothing was reported for the job to count
    assert state.progress.successful_steps == state.progress.stopped_steps == 0


def test_fields_a_run_sets_on_its_record_count_as_set_as_with_pydantic_assignment():
    state = JobStepState(id="s", job_id="j", type="t")
    record = Tracked(state)
    run = StepRun(None, RunKey(JobKey(), "j", "s"), record, LingeringStep, StepStart("s", 1, 2))
    run._set(attempt=2, lease=None)
    assert {"attempt", "lease"} <= state.model_fields_set
    assert state.model_dump(exclude_unset=True) == state.model_dump(include=state.model_fields_set)
    assert state.model_dump(exclude_unset=True)["attempt"] == 2


class FailingReads:
    """Step storage whose `get_many` fails while `failing` is set."""

    def __init__(self, inner: Any, switch: dict[str, bool]) -> None:
        self._inner = inner
        self._switch = switch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def get_many(self, *args: Any) -> Any:
        if self._switch["failing"]:
            raise StorageUnavailableError("injected: reads fail")
        return await self._inner.get_many(*args)


def test_a_waiting_start_whose_record_cannot_be_read_again_ends_instead_of_lingering(
    run, script, lingering
):
    switch = {"failing": False}

    cluster = InProcessCluster(
        options=JobsOptions(max_parallel_steps=8),
        wrap_storage=wrap_steps(lambda steps: FailingReads(steps, switch)),
    )

    async def scenario():
        await cluster.provider.initialize()
        started = await cluster.start(LingeringJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(started.job_id)
        await cluster.settle()
        assert await cluster.manager().resume(started.job_id) == ResumeJobSuccess.SUCCESS
        await cluster.settle()
        switch["failing"] = True
        lingering.finish.set()  # the first run stops; the waiting start cannot read the record
        await cluster.settle()
        return cluster.worker.runs_of(started.job_id)

    try:
        assert run(scenario()) == []
    finally:
        run(cluster.close())
