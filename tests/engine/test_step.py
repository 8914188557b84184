"""JobStep scenarios: reference §h `for_JobStep`, `for_JobStepCheckpointDebounce` and
`for_JobStepThrottle`, plus what a run promises its work: callbacks after the run closed are
refused, a synchronous step runs off the event loop, a step stopped before it got a slot reports
stopped exactly once, and the idempotency key stays the same across runs.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from choreography_ray.engine.messages import StartOutcome, StepStart
from choreography_ray.engine.run_host import CallbackRejected
from choreography_ray.jobs import (
    ActivationCallbackRejected,
    JobKey,
    JobsOptions,
    JobStatus,
    JobStepState,
    JobStepStatus,
    ResumeJobSuccess,
)
from choreography_ray.jobs.step import JobStep, StepContext, StepFailed
from choreography_ray.testing import InProcessCluster

from .fixtures import (
    KeyRequest,
    KeyResult,
    KeyState,
    ScenarioJob,
    ScenarioRequest,
    SyncKeyStep,
    request,
)

# -- steps driven command by command ----------------------------------------------------------


class Control:
    """Commands for `ControlledStep` runs, per key, and what each run saw when it began."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[Any]] = {}
        self.started: list[dict[str, Any]] = []
        self.contexts: list[StepContext] = []
        self.threads: list[dict[str, Any]] = []

    def queue(self, key: str) -> asyncio.Queue[Any]:
        return self.queues.setdefault(key, asyncio.Queue())

    def send(self, key: str, *commands: Any) -> None:
        for command in commands:
            self.queue(key).put_nowait(command)

    def starts_of(self, key: str) -> list[dict[str, Any]]:
        return [start for start in self.started if start["key"] == key]


CONTROL = Control()


@pytest.fixture(autouse=True)
def control() -> Any:
    global CONTROL
    CONTROL = Control()
    yield CONTROL
    CONTROL = Control()


class ControlledStep(JobStep[KeyRequest, KeyState, KeyResult], name="tests.step.controlled-step"):
    """Takes commands: a number checkpoints that many batches, "fail" fails, "done" succeeds."""

    async def perform(self, state: KeyState, ctx: StepContext) -> KeyResult:
        control = CONTROL
        control.started.append(
            {
                "key": state.key,
                "progress": state.progress,
                "attempt": ctx.attempt,
                "idempotency_key": ctx.idempotency_key,
                "step_id": ctx.step_id,
            }
        )
        control.contexts.append(ctx)
        queue = control.queue(state.key)
        while True:
            command = await queue.get()
            if command == "done":
                return KeyResult(key=state.key, value=state.progress)
            if command == "fail":
                raise StepFailed(f"step {state.key} failed")
            for _ in range(command):
                state.progress += 1
                ctx.checkpoint(state)

    def initialize_state(self, request: KeyRequest) -> KeyState:
        return KeyState(key=request.key)


class EveryBatchStep(ControlledStep, name="tests.step.every-batch-step"):
    checkpoint_after_every_batch = True


class ThreadStep(JobStep[KeyRequest, KeyState, int], name="tests.step.thread-step"):
    """A synchronous step: records where it runs, and calls back into its run from there."""

    def perform(self, state: KeyState, ctx: StepContext) -> int:
        try:
            asyncio.get_running_loop()
            on_a_loop = True
        except RuntimeError:
            on_a_loop = False
        state.progress = 7
        ctx.checkpoint(state)  # crosses back to the event loop: would deadlock if run on it
        ctx.progress(50.0, "halfway")
        CONTROL.threads.append({"thread": threading.get_ident(), "on_a_loop": on_a_loop})
        return state.progress

    def initialize_state(self, request: KeyRequest) -> KeyState:
        return KeyState(key=request.key)


class ControlledJob(ScenarioJob, name="tests.step.controlled-job"):
    step_class: type[JobStep[Any, Any, Any]] = ControlledStep

    def prepare_steps(self, request: ScenarioRequest) -> list[Any]:
        return [
            self.create_step(self.step_class, KeyRequest(key=key), name=key) for key in request.keys
        ]


class EveryBatchJob(ControlledJob, name="tests.step.every-batch-job"):
    step_class = EveryBatchStep


class RetryingControlledJob(ControlledJob, name="tests.step.retrying-controlled-job"):
    max_step_attempts = 3


class ThreadJob(ControlledJob, name="tests.step.thread-job"):
    step_class = ThreadStep


DEBOUNCED = JobsOptions(
    max_parallel_steps=8,
    step_checkpoint_batch_interval=3,
    step_checkpoint_flush_interval=5,
)


# -- helpers --------------------------------------------------------------------------------


async def only_step(cluster: InProcessCluster, job_id: str) -> JobStepState:
    [step] = await cluster.storage().steps.get_for_job(job_id)
    return step


def progress_of(step: JobStepState) -> int:
    assert step.state is not None
    return int(step.state.data["progress"])


async def stored_progress(cluster: InProcessCluster, job_id: str) -> tuple[int, int]:
    """The checkpoint in storage, and the record's version."""
    step = await only_step(cluster, job_id)
    return progress_of(step), step.version


async def started(cluster: InProcessCluster, job_type: Any, *keys: str) -> str:
    result = await cluster.start(job_type, request(*keys))
    assert result.error is None, result
    await cluster.settle()
    return result.job_id


# == for_JobStep/when_starting =================================================================


@pytest.mark.parametrize("persisted", [JobStepStatus.RUNNING, JobStepStatus.SCHEDULED])
@pytest.mark.parametrize("recover", ["resume", "rehydrate"])
def test_when_starting_and_the_persisted_state_says_it_runs_in_a_dead_process_it_performs_again(
    run, cluster, script, persisted, recover
):
    async def scenario():
        script.behaviour["a"].block = True
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        job_id = result.job_id
        before = await only_step(cluster, job_id)
        await cluster.crash()
        if persisted != before.status:
            await cluster.storage().steps.save(before.model_copy(update={"status": persisted}))
        manager = cluster.manager()
        if recover == "resume":
            assert await manager.resume(job_id) == ResumeJobSuccess.SUCCESS
        else:
            assert (await (await manager.rehydrate())).resumed == [job_id]
        await cluster.settle()
        ran = script.ran("a")
        script.release("a")
        return before, ran, await cluster.wait(job_id), await only_step(cluster, job_id)

    before, ran, state, step = run(scenario())
    assert before.status == JobStepStatus.RUNNING  # what the dead process left
    assert ran == 2
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert step.status == JobStepStatus.COMPLETED_SUCCESSFULLY


def test_when_starting_and_work_is_already_running_in_this_activation_it_is_already_started(
    run, cluster, script
):
    async def scenario():
        script.behaviour["a"].block = True
        job_id = await started(cluster, ScenarioJob, "a")
        step = await only_step(cluster, job_id)
        job = await cluster.manager().get(job_id)
        start = StepStart(step.id, job.execution_generation, step.attempt)
        answers = [
            await cluster.worker.start_steps(JobKey(), job_id, ScenarioJob.name, [start]),
            await cluster.worker.start_steps(JobKey(), job_id, ScenarioJob.name, [start]),
        ]
        await cluster.settle()
        ran = script.ran("a")
        script.release("a")
        return answers, ran, await cluster.wait(job_id)

    answers, ran, state = run(scenario())
    assert [[r.outcome for r in answer] for answer in answers] == [
        [StartOutcome.ALREADY_STARTED],
        [StartOutcome.ALREADY_STARTED],
    ]
    assert ran == 1
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 1


# == for_JobStepCheckpointDebounce =============================================================


@pytest.mark.parametrize("options", [DEBOUNCED])
def test_when_nothing_has_been_reported_no_checkpoint_is_written(run, cluster, script, control):
    async def scenario():
        job_id = await started(cluster, ControlledJob, "a")
        first = await stored_progress(cluster, job_id)
        await cluster.advance(60)
        return first, await stored_progress(cluster, job_id)

    first, later = run(scenario())
    assert first[0] == 0
    assert later == first  # no write at all, not even by the flush timer


@pytest.mark.parametrize("options", [DEBOUNCED])
def test_when_reporting_fewer_checkpoints_than_the_interval_none_is_written(
    run, cluster, script, control
):
    async def scenario():
        job_id = await started(cluster, ControlledJob, "a")
        before = await stored_progress(cluster, job_id)
        control.send("a", 2)
        await cluster.settle()
        return before, await stored_progress(cluster, job_id)

    before, after = run(scenario())
    assert after == before
    assert after[0] == 0


@pytest.mark.parametrize("options", [DEBOUNCED])
def test_when_reporting_as_many_checkpoints_as_the_interval_the_checkpoint_is_written(
    run, cluster, script, control
):
    async def scenario():
        job_id = await started(cluster, ControlledJob, "a")
        seen = []
        for batches in (3, 2, 1):
            control.send("a", batches)
            await cluster.settle()
            seen.append((await stored_progress(cluster, job_id))[0])
        control.send("a", "done")
        await cluster.settle()
        return seen

    assert run(scenario()) == [3, 3, 6]


@pytest.mark.parametrize("options", [DEBOUNCED])
def test_when_the_flush_interval_passes_a_pending_checkpoint_is_written(
    run, cluster, script, control
):
    async def scenario():
        job_id = await started(cluster, ControlledJob, "a")
        control.send("a", 1)
        await cluster.settle()
        seen = [(await stored_progress(cluster, job_id))[0]]
        await cluster.advance(4.9)
        seen.append((await stored_progress(cluster, job_id))[0])
        await cluster.advance(0.2)
        seen.append((await stored_progress(cluster, job_id))[0])
        control.send("a", "done")
        await cluster.settle()
        return seen

    assert run(scenario()) == [0, 0, 1]


@pytest.mark.parametrize("options", [DEBOUNCED])
def test_when_the_step_must_checkpoint_after_every_batch_every_checkpoint_is_written(
    run, cluster, script, control
):
    async def scenario():
        job_id = await started(cluster, EveryBatchJob, "a")
        seen = []
        for _ in range(3):
            control.send("a", 1)
            await cluster.settle()
            seen.append((await stored_progress(cluster, job_id))[0])
        control.send("a", "done")
        await cluster.settle()
        return seen

    assert run(scenario()) == [1, 2, 3]


@pytest.mark.parametrize("options", [DEBOUNCED])
def test_when_the_state_is_persisted_with_the_outcome_the_pending_checkpoint_goes_with_it(
    run, cluster, script, control
):
    async def scenario():
        job_id = await started(cluster, ControlledJob, "a")
        control.send("a", 1, "done")
        await cluster.settle()
        return await only_step(cluster, job_id), await cluster.wait(job_id)

    step, state = run(scenario())
    assert step.status == JobStepStatus.COMPLETED_SUCCESSFULLY
    assert progress_of(step) == 1
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


@pytest.mark.parametrize("options", [DEBOUNCED])
def test_when_a_run_crashes_it_continues_from_its_last_durable_checkpoint(
    run, cluster, script, control
):
    async def scenario():
        job_id = await started(cluster, ControlledJob, "a")
        control.send("a", 3)  # durable
        await cluster.settle()
        control.send("a", 1)  # pending
        await cluster.settle()
        durable = (await stored_progress(cluster, job_id))[0]
        await cluster.crash()
        control.queues.clear()
        assert await cluster.manager().resume(job_id) == ResumeJobSuccess.SUCCESS
        await cluster.settle()
        control.send("a", "done")
        await cluster.settle()
        return durable, await cluster.wait(job_id)

    durable, state = run(scenario())
    assert durable == 3
    assert [start["progress"] for start in control.starts_of("a")] == [0, 3]
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


# == for_JobStepThrottle =======================================================================


@pytest.mark.parametrize(
    ("cpus", "expected", "window"), [(8, 7, 1024), (2, 1, 256), (1, 1, 128), (None, 1, 128)]
)
def test_when_the_throttle_is_not_configured_it_allows_one_less_than_the_cpus_and_at_least_one(
    run, script, monkeypatch, cpus, expected, window
):
    """The seed's rule holds for synchronous steps (a CPU each); async steps, which mostly
    wait, get a window of 128 per CPU (docs/decisions.md, "Parallelism by the step's kind")."""
    monkeypatch.setattr("choreography_ray.jobs.options.os.cpu_count", lambda: cpus)
    monkeypatch.setattr("choreography_ray.engine.worker.os.cpu_count", lambda: cpus)
    options = JobsOptions()
    cluster = InProcessCluster(options=options)
    try:
        assert options.max_parallel_steps is None
        assert options.effective_max_parallel_steps == expected
        assert cluster.worker.max_parallel_sync_steps == expected
        assert cluster.worker.max_parallel_steps == window
    finally:
        run(cluster.close())


def test_when_the_throttle_is_configured_with_a_specific_value_that_value_is_used(run, script):
    options = JobsOptions(max_parallel_steps=3)
    cluster = InProcessCluster(options=options)
    try:
        assert options.effective_max_parallel_steps == 3
        assert cluster.worker.max_parallel_steps == 3
    finally:
        run(cluster.close())


@pytest.mark.parametrize("options", [JobsOptions(max_parallel_steps=2)])
def test_when_acquiring_and_releasing_slots_never_more_than_the_limit_perform_at_once(
    run, cluster, script
):
    keys = ["a", "b", "c", "d", "e"]

    async def scenario():
        for key in keys:
            script.behaviour[key].block = True
        job_id = await started(cluster, ScenarioJob, *keys)
        performing = [len(script.runs)]
        while len(script.runs) < len(keys) or any(not script.gate(k).is_set() for k in keys):
            running = [k for k, _ in script.runs if not script.gate(k).is_set()]
            assert running, "no step performs, yet some never ran"
            script.release(running[0])
            await cluster.settle()
            performing.append(len([k for k, _ in script.runs if not script.gate(k).is_set()]))
        return performing, await cluster.wait(job_id)

    performing, state = run(scenario())
    assert performing[0] == 2
    assert max(performing) <= 2
    assert cluster.worker.peak_parallel == 2
    assert sorted(k for k, _ in script.runs) == keys
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


# == what a run promises its work ==============================================================


def test_when_step_work_calls_back_after_its_run_closed_the_callback_is_refused(
    run, cluster, script, control
):
    async def scenario():
        job_id = await started(cluster, ControlledJob, "a")
        control.send("a", "done")
        await cluster.settle()
        before = await only_step(cluster, job_id)
        [ctx] = control.contexts
        errors = []
        for callback in (
            lambda: ctx.checkpoint(KeyState(key="a", progress=99)),
            lambda: ctx.progress(99.0, "too late"),
        ):
            with pytest.raises(CallbackRejected) as refused:
                callback()
            errors.append(refused.value)
        await cluster.settle()
        return before, errors, await only_step(cluster, job_id)

    before, errors, after = run(scenario())
    assert [error.code for error in errors] == [ActivationCallbackRejected.CLOSED] * 2
    assert after.version == before.version
    assert progress_of(after) == 0


def test_when_a_step_is_synchronous_it_runs_off_the_event_loop(run, cluster, script, control):
    async def scenario():
        loop_thread = threading.get_ident()
        job_id = await started(cluster, ThreadJob, "a")
        return loop_thread, await cluster.wait(job_id), await only_step(cluster, job_id)

    loop_thread, state, step = run(scenario())
    [seen] = control.threads
    assert seen["thread"] != loop_thread
    assert not seen["on_a_loop"]
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert step.status == JobStepStatus.COMPLETED_SUCCESSFULLY
    assert progress_of(step) == 7
    assert script.outcomes[0].result == 7


@pytest.mark.parametrize("options", [JobsOptions(max_parallel_steps=1)])
def test_when_a_step_is_stopped_before_it_got_a_slot_it_reports_stopped_exactly_once(
    run, cluster, script
):
    async def scenario():
        script.behaviour["hog"].block = True
        hog = await started(cluster, ScenarioJob, "hog")
        waiting = await started(cluster, ScenarioJob, "b")
        assert [k for k, _ in script.runs] == ["hog"]
        await cluster.manager().stop(waiting)
        stopped = await cluster.wait(waiting)
        script.release("hog")
        await cluster.settle()
        return (
            stopped,
            await cluster.wait(waiting),
            await only_step(cluster, waiting),
            await cluster.wait(hog),
        )

    stopped, later, step, hog = run(scenario())
    assert stopped.status == JobStatus.STOPPED
    assert stopped.stop_finalized
    assert stopped.progress.stopped_steps == 1
    assert later.progress == stopped.progress
    assert step.status == JobStepStatus.STOPPED
    assert script.ran("b") == 0
    assert [o.status for o in script.outcomes if o.name == "b"] == [JobStepStatus.STOPPED]
    assert script.hooks.count("on_stopped") == 1
    assert hog.status == JobStatus.COMPLETED_SUCCESSFULLY


@pytest.mark.parametrize("options", [JobsOptions(max_parallel_steps=1)])
def test_when_a_job_is_stopped_its_performing_and_its_queued_steps_each_report_stopped_once(
    run, cluster, script
):
    async def scenario():
        script.behaviour["a"].block = True
        script.behaviour["b"].block = True
        job_id = await started(cluster, ScenarioJob, "a", "b")
        assert len(script.runs) == 1
        await cluster.manager().stop(job_id)
        state = await cluster.wait(job_id)
        script.release("a", "b")
        await cluster.settle()
        return state, await cluster.storage().steps.get_for_job(job_id)

    state, steps = run(scenario())
    assert state.status == JobStatus.STOPPED
    assert state.stop_finalized
    assert state.progress.stopped_steps == 2
    assert [s.status for s in steps] == [JobStepStatus.STOPPED] * 2
    assert len(script.runs) == 1
    assert sorted(o.name for o in script.outcomes) == ["a", "b"]
    assert all(o.status == JobStepStatus.STOPPED for o in script.outcomes)
    assert script.hooks.count("on_stopped") == 1


def test_the_idempotency_key_is_the_same_across_a_re_run_after_a_crash(
    run, cluster, script, control
):
    async def scenario():
        job_id = await started(cluster, ControlledJob, "a")
        await cluster.crash()
        control.queues.clear()
        await cluster.manager().resume(job_id)
        await cluster.settle()
        control.send("a", "done")
        return job_id, await cluster.wait(job_id)

    job_id, state = run(scenario())
    first, second = control.starts_of("a")
    assert first["idempotency_key"] == second["idempotency_key"]
    assert first["idempotency_key"] == f"{job_id}/{first['step_id']}"
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_the_idempotency_key_is_the_same_across_retries(run, cluster, script, control):
    async def scenario():
        job_id = await started(cluster, RetryingControlledJob, "a")
        control.send("a", "fail")
        await cluster.settle()
        await cluster.advance(cluster.options.max_step_retry_backoff.total_seconds())
        control.send("a", "done")
        return job_id, await cluster.wait(job_id)

    job_id, state = run(scenario())
    first, second = control.starts_of("a")
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert first["idempotency_key"] == second["idempotency_key"]
    assert first["idempotency_key"] == f"{job_id}/{first['step_id']}"
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


@pytest.mark.parametrize("options", [JobsOptions(max_parallel_steps=1)])
def test_a_run_stopped_in_its_work_frees_its_runner_for_the_next_queued_step(run, cluster, script):
    async def scenario():
        script.behaviour["a"].block = True
        first = await started(cluster, ScenarioJob, "a")
        second = await started(cluster, ScenarioJob, "b")  # queued behind "a": one slot
        queued = [k for k, _ in script.runs]
        await cluster.manager().stop(first)
        return queued, await cluster.wait(first), await cluster.wait(second)

    queued, first, second = run(scenario())
    assert queued == ["a"]
    assert first.status == JobStatus.STOPPED
    # The runner that was cancelled inside "a" goes on to "b", and "b" is not cancelled.
    assert second.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert [k for k, _ in script.runs] == ["a", "b"]


DOCUMENTED_CONTEXT = {
    "attempt",
    "cancelled",
    "checkpoint",
    "idempotency_key",
    "job_id",
    "now",
    "progress",
    "raise_if_cancelled",
    "step_id",
    "wait_cancelled",
}
"""What docs/jobs.md lists of `ctx` (with the ids the idempotency key is made of)."""


def test_the_step_context_exposes_only_what_the_docs_list_and_no_engine_internals(
    run, cluster, script, control
):
    async def scenario():
        job_id = await started(cluster, ControlledJob, "a")
        [ctx] = control.contexts
        public = {name for name in dir(ctx) if not name.startswith("_")}
        reached = [name for name in ("worker", "record", "runner", "key") if hasattr(ctx, name)]
        with pytest.raises(AttributeError):
            ctx.worker = object()  # nothing can be hung on it either
        control.send("a", "done")
        await cluster.settle()
        return job_id, ctx, public, reached

    job_id, ctx, public, reached = run(scenario())
    assert type(ctx) is StepContext
    assert public == DOCUMENTED_CONTEXT
    assert reached == []
    assert ctx.job_id == job_id and ctx.attempt == 1


class _HeldSyncRunner:
    """Synchronous work that performs until the test lets it end, one future per run. It
    says none is in flight, so that the in-process cluster settles while they wait."""

    in_flight = 0

    def __init__(self) -> None:
        self.performing = 0
        self.peak = 0
        self.held: list[asyncio.Future[Any]] = []

    async def run(self, step: Any, state: Any, run: Any) -> Any:
        self.performing += 1
        self.peak = max(self.peak, self.performing)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.held.append(future)
        try:
            return await future
        finally:
            self.performing -= 1

    def close(self) -> None:
        pass


def _sync_plan(job: Any, request: Any) -> list[Any]:
    return [job.create_step(SyncKeyStep, KeyRequest(key=key)) for key in request.keys]


@pytest.mark.parametrize("options", [JobsOptions()])
def test_synchronous_steps_beyond_their_cpus_wait_prepared_not_running(run, cluster, script):
    """The default window is wide for async steps; synchronous ones still perform no more
    than `max_parallel_sync_steps` at once, and the others wait as prepared, not Running."""
    runner = _HeldSyncRunner()
    worker = cluster.worker
    worker.sync_runner = runner
    worker.sync_slots = asyncio.Semaphore(1)
    script.plan_override = _sync_plan
    assert worker.max_parallel_steps >= 128

    async def scenario():
        job_id = await started(cluster, ScenarioJob, "a", "b", "c")
        steps = await cluster.storage().steps.get_for_job(job_id)
        statuses = sorted(step.status for step in steps)
        waiting = JobStepStatus.UNKNOWN  # prepared, not yet run
        assert statuses == [waiting, waiting, JobStepStatus.RUNNING]
        while len(runner.held) < 3 or not all(f.done() for f in runner.held):
            pending = [f for f in runner.held if not f.done()]
            assert len(pending) == 1, "one synchronous step performs at a time"
            pending[0].set_result(1)
            await cluster.settle()
        return await cluster.wait(job_id)

    state = run(scenario())
    assert runner.peak == 1
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


@pytest.mark.parametrize("options", [JobsOptions()])
def test_a_stop_settles_synchronous_steps_waiting_for_a_cpu_at_once(run, cluster, script):
    runner = _HeldSyncRunner()
    worker = cluster.worker
    worker.sync_runner = runner
    worker.sync_slots = asyncio.Semaphore(1)
    script.plan_override = _sync_plan

    async def scenario():
        job_id = await started(cluster, ScenarioJob, "a", "b", "c")
        assert len(runner.held) == 1
        await cluster.manager().stop(job_id)
        await cluster.settle()
        waiting = [
            s
            for s in await cluster.storage().steps.get_for_job(job_id)
            if s.status == JobStepStatus.STOPPED
        ]
        runner.held[0].set_result(1)  # the performing one ends when its work does
        await cluster.settle()
        return waiting, await cluster.wait(job_id)

    waiting, state = run(scenario())
    assert len(waiting) >= 2, "the two waiting for a CPU settled as stopped without performing"
    assert len(runner.held) == 1
    assert state.status == JobStatus.STOPPED
