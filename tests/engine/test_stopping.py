"""Stopping and draining (seed: what stopping and draining guarantee; recovery: stops and
removals). One test per behaviour the seed states, named after it; in-process, fake clock."""

from __future__ import annotations

import asyncio
import functools
import itertools
from datetime import timedelta
from typing import Any

import pytest

from choreography_ray.engine.messages import StopRequest, StopResult
from choreography_ray.engine.run_host import CallbackRejected
from choreography_ray.jobs import (
    CannotResumeJobError,
    DrainJobResult,
    JobsOptions,
    JobStatus,
    JobStepStatus,
    RemoveJobError,
    RemoveJobFailed,
    ResumeJobFailed,
    StopJobError,
    StopJobFailed,
)
from choreography_ray.jobs.errors import ActivationCallbackRejected, StorageUnavailableError
from choreography_ray.jobs.state import JobKey
from choreography_ray.jobs.step import JobStep, StepCancelled, StepContext
from choreography_ray.testing import InProcessCluster
from choreography_ray.testing.faults import WriteFaults

from ..storage.support import whole_plan
from .fixtures import KeyRequest, KeyResult, KeyState, KeyStep, ScenarioJob, WindowJob, request


class Slow:
    """What `SlowToStopStep` runs do: asked to stop, each goes on until `finish` is set, then
    checkpoints (to see whether the callback is refused) and stops, or succeeds when
    `succeed` says so (work that finished as the stop came in)."""

    def __init__(self) -> None:
        self.finish = asyncio.Event()
        self.succeed = False
        self.refused: list[Any] = []
        self.runs = 0
        self.later_runs_succeed = False


SLOW = Slow()


@pytest.fixture
def slow():
    global SLOW
    SLOW = Slow()
    yield SLOW
    SLOW.finish.set()


class SlowToStopStep(JobStep[KeyRequest, KeyState, KeyResult], name="tests.stopping.slow"):
    async def perform(self, state: KeyState, ctx: StepContext) -> KeyResult:
        slow = SLOW
        slow.runs += 1
        if slow.later_runs_succeed and slow.runs > 1:
            return KeyResult(key=state.key, value=slow.runs)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            while not slow.finish.is_set():
                try:
                    await slow.finish.wait()
                except asyncio.CancelledError:
                    continue
        try:
            state.progress += 1
            ctx.checkpoint(state)
        except CallbackRejected as refused:
            slow.refused.append(refused.code)
        if slow.succeed:
            return KeyResult(key=state.key, value=7)
        raise StepCancelled()

    def initialize_state(self, request: KeyRequest) -> KeyState:
        return KeyState(key=request.key)


class SlowJob(ScenarioJob, name="tests.stopping.slow-job"):
    def prepare_steps(self, request: Any) -> list[Any]:
        return [self.create_step(SlowToStopStep, KeyRequest(key=k), name=k) for k in request.keys]


def hold_reports(cluster, monkeypatch) -> list:
    """Reports the worker sends, kept from the job: the worker's answers alone are tested."""
    sent: list = []

    async def report(job_key, job_id, reports):
        sent.extend(reports)

    monkeypatch.setattr(cluster, "report", report)
    return sent


async def running_step(cluster, *keys: str) -> tuple[str, list[str]]:
    result = await cluster.start(SlowJob, request(*keys))
    await cluster.settle()
    steps = await cluster.storage().steps.get_for_job(result.job_id)
    return result.job_id, sorted(s.id for s in steps)


def stop_request(job_id: str, step_ids, *, removing: bool = False) -> StopRequest:
    return StopRequest(JobKey(), job_id, generation=1, step_ids=tuple(step_ids), removing=removing)


# -- stopping waits for the work -----------------------------------------------------------------


def test_a_step_stop_that_settles_in_time_answers_its_persisted_outcome_and_reports_it_once(
    run, cluster, script, slow, monkeypatch
):
    sent = hold_reports(cluster, monkeypatch)
    slow.finish.set()

    async def scenario():
        job_id, ids = await running_step(cluster, "a")
        answer = await cluster.worker.stop_and_wait(stop_request(job_id, ids))
        await cluster.settle()
        return answer, await cluster.storage().steps.get_for_job(job_id)

    answer, [step] = run(scenario())
    assert [r.status for r in answer.settled] == [JobStepStatus.STOPPED]
    assert answer.timed_out == []
    assert step.status == JobStepStatus.STOPPED
    assert [r.status for r in sent] == [JobStepStatus.STOPPED]


def test_a_timed_out_stop_records_nothing_refuses_callbacks_and_reports_once_the_work_settles(
    run, cluster, script, slow, monkeypatch
):
    """The seed: after `step_stop_timeout` Stop answers StopTimedOut having recorded nothing;
    the work's callbacks are refused with Closed; once it settles the step reports itself
    stopped and records it, exactly once."""
    sent = hold_reports(cluster, monkeypatch)

    async def scenario():
        job_id, ids = await running_step(cluster, "a")
        stopping = asyncio.ensure_future(cluster.worker.stop_and_wait(stop_request(job_id, ids)))
        await cluster.advance(9.9)
        early = stopping.done()
        await cluster.advance(0.1)  # the default deadline: 10 s
        answer = await stopping
        [before] = await cluster.storage().steps.get_for_job(job_id)
        reports_before = list(sent)
        slow.finish.set()
        await cluster.settle()
        [after] = await cluster.storage().steps.get_for_job(job_id)
        return early, answer, ids, before, reports_before, after

    early, answer, ids, before, reports_before, after = run(scenario())
    assert not early
    assert answer.timed_out == ids and answer.settled == []
    assert before.status == JobStepStatus.RUNNING and reports_before == []
    assert slow.refused == [ActivationCallbackRejected.CLOSED]
    assert after.status == JobStepStatus.STOPPED
    assert [r.status for r in sent] == [JobStepStatus.STOPPED]


def test_a_second_stop_or_a_removal_joins_the_stop_in_progress(
    run, cluster, script, slow, monkeypatch
):
    sent = hold_reports(cluster, monkeypatch)

    async def scenario():
        job_id, ids = await running_step(cluster, "a")
        first = asyncio.ensure_future(cluster.worker.stop_and_wait(stop_request(job_id, ids)))
        await cluster.settle()
        second = asyncio.ensure_future(cluster.worker.stop_and_wait(stop_request(job_id, ids)))
        await cluster.settle()
        await cluster.worker.stop_steps(stop_request(job_id, ids, removing=True))
        slow.finish.set()
        await cluster.settle()
        return await first, await second

    first, second = run(scenario())
    assert first.settled == second.settled and len(first.settled) == 1
    assert len(sent) == 1  # the job hears about the step once
    assert sent[0].status == JobStepStatus.REMOVING


def test_the_outcome_is_the_one_the_work_produced(run, cluster, script, slow, monkeypatch):
    """Work that finished successfully as the stop came in reports success, not a stop."""
    sent = hold_reports(cluster, monkeypatch)
    slow.succeed = True
    slow.finish.set()

    async def scenario():
        job_id, ids = await running_step(cluster, "a")
        answer = await cluster.worker.stop_and_wait(stop_request(job_id, ids))
        await cluster.settle()
        return answer, await cluster.storage().steps.get_for_job(job_id)

    answer, [step] = run(scenario())
    assert [r.status for r in answer.settled] == [JobStepStatus.COMPLETED_SUCCESSFULLY]
    assert step.status == JobStepStatus.COMPLETED_SUCCESSFULLY
    assert [r.status for r in sent] == [JobStepStatus.COMPLETED_SUCCESSFULLY]


# -- if the job's notification to a step fails, the job retries it ------------------------------


class FailingStops:
    """Stop notifications that fail `times` times, then reach the worker; when each was sent."""

    def __init__(self, cluster, times: int) -> None:
        self.cluster = cluster
        self.worker_stop = cluster.stop_steps
        self.times = times
        self.sent: list[float] = []

    async def __call__(self, request: StopRequest) -> StopResult:
        clock = self.cluster.clock
        self.sent.append((clock.now() - START).total_seconds())
        if len(self.sent) <= self.times:
            raise StorageUnavailableError("the worker cannot be reached")
        return await self.worker_stop(request)


START = None


def test_a_failed_stop_notification_is_retried_and_the_stop_waits_for_the_work(
    run, cluster, script, monkeypatch
):
    """The seed: retried after 1 s, doubling to 60 s, while the job stays stopped; `on_stopped`
    only once every step has reported. Never finalized while the work still runs."""
    global START
    script.behaviour["a"].block = True
    stops = FailingStops(cluster, times=3)
    monkeypatch.setattr(cluster, "stop_steps", stops)

    async def scenario():
        global START
        START = cluster.clock.now()
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        await cluster.settle()
        before = await cluster.manager().get(result.job_id)
        hooks_before = list(script.hooks)
        await cluster.advance(1)  # second try fails
        await cluster.advance(1.5)  # not yet: the third try waits 2 s
        tries_midway = len(stops.sent)
        await cluster.advance(0.5)  # third try fails
        await cluster.advance(4)  # fourth reaches the worker
        return before, hooks_before, tries_midway, await cluster.wait(result.job_id)

    before, hooks_before, tries_midway, state = run(scenario())
    assert before.status == JobStatus.STOPPED and not before.stop_finalized
    assert before.progress.stopped_steps == 0
    assert "on_stopped" not in hooks_before
    assert tries_midway == 2
    assert stops.sent == [0.0, 1.0, 3.0, 7.0]
    assert state.stop_finalized and state.progress.stopped_steps == 1
    assert script.hooks.count("on_stopped") == 1
    [step] = run(cluster.storage().steps.get_for_job(state.id))
    assert step.status == JobStepStatus.STOPPED


def test_stop_notification_retries_double_up_to_sixty_seconds(run, cluster, script, monkeypatch):
    global START
    script.behaviour["a"].block = True
    stops = FailingStops(cluster, times=10)
    monkeypatch.setattr(cluster, "stop_steps", stops)

    async def scenario():
        global START
        START = cluster.clock.now()
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        for _ in range(10):
            await cluster.advance(60)
        return await cluster.wait(result.job_id)

    state = run(scenario())
    gaps = [b - a for a, b in zip(stops.sent, stops.sent[1:], strict=False)]
    assert gaps[:8] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert state.stop_finalized


def test_stop_notification_retries_end_when_the_job_resumes(run, cluster, script, monkeypatch):
    """Retried only while the job stays stopped: a resume ends them."""
    global START
    script.behaviour["a"].block = True
    stops = FailingStops(cluster, times=1)
    monkeypatch.setattr(cluster, "stop_steps", stops)

    async def scenario():
        global START
        START = cluster.clock.now()
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        await cluster.settle()
        await cluster.manager().resume(result.job_id)
        await cluster.settle()
        sent = len(stops.sent)
        await cluster.advance(120)
        return sent, await cluster.manager().get(result.job_id)

    sent, state = run(scenario())
    assert len(stops.sent) == sent
    assert state.status == JobStatus.RUNNING


# -- the outcome is the one the work produced ----------------------------------------------------


def test_a_step_that_finished_as_the_stop_arrived_counts_as_the_success_storage_holds(
    run, cluster, script, monkeypatch
):
    """The job's counts equal step storage once the stop settles, even when a success's report
    is still on its way when the worker says the step no longer runs."""
    keys = [f"k{n}" for n in range(6)]
    for key in keys[3:]:
        script.behaviour[key].block = True

    held = []

    async def on_the_way(job_key, job_id, reports):
        held.extend(reports)

    async def scenario():
        deliver = cluster.report
        monkeypatch.setattr(cluster, "report", on_the_way)
        result = await cluster.start(ScenarioJob, request(*keys))
        await cluster.settle()  # k0..k2 succeeded and are stored; their reports are on the way
        monkeypatch.setattr(cluster, "report", deliver)
        await cluster.manager().stop(result.job_id)
        await cluster.settle()
        await deliver(JobKey(), result.job_id, held)  # they arrive after the stop
        return await cluster.wait(result.job_id)

    state = run(scenario())
    steps = run(cluster.storage().steps.get_for_job(state.id))
    stored = sorted(s.status for s in steps)
    assert stored == [JobStepStatus.COMPLETED_SUCCESSFULLY] * 3 + [JobStepStatus.STOPPED] * 3
    assert (state.progress.successful_steps, state.progress.stopped_steps) == (3, 3)
    assert state.stop_finalized


# -- a stop and a drain differ -------------------------------------------------------------------


def test_a_drain_returns_drained_once_every_step_answered_with_its_persisted_outcome(
    run, cluster, script
):
    """Drained: no step's work runs, every outcome is in step storage (a step that never got
    to run is written Stopped), the stop hooks ran, the job's state is persisted."""
    for key in ("a", "b", "c"):
        script.behaviour[key].block = True

    async def scenario():
        result = await cluster.start(WindowJob, request("a", "b", "c", "d", stages={"d": 1}))
        await cluster.settle()  # a and b run; c waits for room in the window; d's stage waits
        outcome = await cluster.manager().drain(result.job_id, within=5)
        stored = await cluster.storage().jobs.get(result.job_id)
        steps = await cluster.storage().steps.get_for_job(result.job_id)
        return outcome, stored, {s.name: s.status for s in steps}

    outcome, stored, steps = run(scenario())
    assert outcome.result == DrainJobResult.DRAINED
    assert len(outcome.drained) == 3 and outcome.not_drained == ()
    assert steps == {
        "a": JobStepStatus.STOPPED,
        "b": JobStepStatus.STOPPED,
        "c": JobStepStatus.STOPPED,
        "d": JobStepStatus.UNKNOWN,  # its stage never started: nothing to stop
    }
    assert stored.status == JobStatus.STOPPED
    assert stored.stop_finalized and not stored.pending_drain
    assert stored.progress.stopped_steps == 3
    assert script.hooks.count("on_stopped") == 1
    assert script.hooks.count("on_step_completed_or_stopped") == 3


def test_a_drain_counts_a_step_as_drained_only_by_its_own_answer(
    run, cluster, script, slow, monkeypatch
):
    """TimedOut with the steps that did not answer; the pending drain stays persisted and
    Resume() refuses with JobCannotBeResumed until every step has reported."""

    async def scenario():
        job_id, ids = await running_step(cluster, "a")
        draining = asyncio.ensure_future(cluster.manager().drain(job_id, within=5))
        await cluster.advance(5)
        outcome = await draining
        pending = await cluster.storage().jobs.get(job_id)
        hooks = list(script.hooks)
        with pytest.raises(ResumeJobFailed) as refused:
            await cluster.manager().resume(job_id)
        slow.finish.set()  # the work settles: it persists its stop and reports
        await cluster.settle()
        done = await cluster.storage().jobs.get(job_id)
        return ids, outcome, pending, hooks, refused.value.code, done

    ids, outcome, pending, hooks, code, done = run(scenario())
    assert outcome.result == DrainJobResult.TIMED_OUT
    assert outcome.not_drained == tuple(ids) and outcome.drained == ()
    assert pending.pending_drain and not pending.stop_finalized
    assert "on_stopped" not in hooks
    assert code == CannotResumeJobError.JOB_CANNOT_BE_RESUMED
    assert not done.pending_drain and done.stop_finalized
    assert script.hooks.count("on_stopped") == 1


async def _stopped_as_the_write_fails(script: Any, stop: Any) -> tuple[Any, Any, Any]:
    """A one-step job stopped by `stop(manager, job_id)` as its write fails: the answer's
    code, the job as stored then, and the job once its step was let finish."""
    faults = WriteFaults()
    cluster = InProcessCluster(wrap_storage=faults.wrap)
    script.behaviour["a"].block = True
    async with cluster:
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        faults.fail_at = {faults.writes + 1}
        with pytest.raises(StopJobFailed) as refused:
            await stop(cluster.manager(), result.job_id)
        stored = await cluster.storage().jobs.get(result.job_id)
        script.release("a")
        return refused.value.code, stored, await cluster.wait(result.job_id)


def test_a_drain_is_persisted_as_stopped_with_the_pending_drain_in_one_write(run, script):
    """A drain whose write fails answers CouldNotPersistStop and leaves the job as it was."""
    code, stored, done = run(
        _stopped_as_the_write_fails(script, lambda manager, job_id: manager.drain(job_id, 5))
    )
    assert code == StopJobError.COULD_NOT_PERSIST_STOP
    assert stored.status == JobStatus.RUNNING and not stored.pending_drain
    assert done.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_a_stop_whose_write_fails_answers_could_not_persist_stop_and_leaves_the_job_running(
    run, script
):
    """The recovery seed: `Job.Stop` answers CouldNotPersistStop when the stop could not be
    written, and leaves the job as it was: its step runs on and the job completes."""
    code, stored, done = run(
        _stopped_as_the_write_fails(script, lambda manager, job_id: manager.stop(job_id))
    )
    assert code == StopJobError.COULD_NOT_PERSIST_STOP
    assert stored.status == JobStatus.RUNNING and not stored.stop_finalized
    assert done.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert script.hooks.count("on_stopped") == 0


def test_a_removal_whose_write_fails_leaves_the_job_as_it_was_and_a_second_removal_works(
    run, script
):
    """A failed Removing write is answered with RemoveJobError.UNKNOWN and leaves the job as
    a failed stop write does: storage still says Running, the activation lets go of its
    copy, and a second `remove()` writes Removing, stops the step and clears the job (it is
    not answered JOB_IS_ALREADY_BEING_REMOVED, and the step does not run to completion)."""
    faults = WriteFaults()
    cluster = InProcessCluster(wrap_storage=faults.wrap)
    script.behaviour["a"].block = True

    async def scenario():
        async with cluster:
            result = await cluster.start(ScenarioJob, request("a"))
            await cluster.settle()
            first = cluster.manager().activation(result.job_id)
            faults.fail_at = {faults.writes + 1}
            with pytest.raises(RemoveJobFailed) as refused:
                await cluster.manager().remove(result.job_id)
            stored = await cluster.storage().jobs.get(result.job_id)
            let_go = first.released and first.state.status == JobStatus.RUNNING
            await cluster.manager().remove(result.job_id)  # no error: it is written now
            await cluster.settle()
            cleared = await cluster.storage().jobs.find(result.job_id)
            steps = await cluster.storage().steps.count_for_job(result.job_id)
            return refused.value.code, stored, let_go, cleared, steps

    code, stored, let_go, cleared, steps = run(scenario())
    assert code == RemoveJobError.UNKNOWN
    assert stored.status == JobStatus.RUNNING
    assert let_go
    assert cleared is None and steps == 0
    # the step was stopped as the job was removed, not left to complete
    assert [outcome.status for outcome in script.outcomes] == [JobStepStatus.REMOVING]
    assert script.hooks.count("on_stopped") == 1


def test_the_pending_drain_survives_the_jobs_controller(run, cluster, script, slow):
    """The controller goes away mid-drain: the job's next activation completes the drain."""

    async def scenario():
        job_id, _ = await running_step(cluster, "a")
        draining = asyncio.ensure_future(cluster.manager().drain(job_id, within=5))
        await cluster.advance(5)
        await draining
        await cluster.crash()  # every process: the controller and the step's worker
        slow.finish.set()
        await (await cluster.manager().rehydrate())
        await cluster.settle()
        steps = await cluster.storage().steps.get_for_job(job_id)
        return await cluster.storage().jobs.get(job_id), steps

    state, [step] = run(scenario())
    assert not state.pending_drain and state.stop_finalized
    assert state.status == JobStatus.STOPPED and state.progress.stopped_steps == 1
    assert step.status == JobStepStatus.STOPPED
    assert script.hooks.count("on_stopped") == 1


def test_a_drain_of_a_missing_or_completed_job_says_so(run, cluster, script):
    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.wait(result.job_id)
        return (
            await cluster.manager().drain(result.job_id),
            await cluster.manager().drain("no-such-job"),
        )

    completed, missing = run(scenario())
    assert completed.result == DrainJobResult.COMPLETED
    assert missing.result == DrainJobResult.NOT_FOUND


def test_a_graceful_host_shutdown_writes_no_final_status_and_reports_nothing(
    run, cluster, script, slow, monkeypatch
):
    """Deactivation: the step stays Running for recovery, even when its work settles after
    (here: it ignores the cancellation and succeeds)."""
    sent = hold_reports(cluster, monkeypatch)
    slow.succeed = True

    async def scenario():
        job_id, _ = await running_step(cluster, "a")
        worker = cluster.worker
        await worker.close()
        slow.finish.set()
        await cluster.settle()
        for _ in range(50):
            await asyncio.sleep(0)
        return await cluster.storage().steps.get_for_job(job_id)

    [step] = run(scenario())
    assert step.status == JobStepStatus.RUNNING
    assert sent == []


def test_a_long_drain_asks_again_in_rounds_of_the_step_stop_timeout(run, cluster, script, slow):
    """Each round waits at most `step_stop_timeout`, below the bound on calls between hosts; a
    step that settles in a later round, within the drain's timeout, is drained."""

    async def scenario():
        job_id, ids = await running_step(cluster, "a")
        draining = asyncio.ensure_future(cluster.manager().drain(job_id, within=25))
        await cluster.advance(10)  # the first round times out: callbacks are refused now
        first_round_over = not draining.done()
        await cluster.advance(5)
        slow.finish.set()
        await cluster.settle()
        return ids, first_round_over, await draining

    ids, first_round_over, outcome = run(scenario())
    assert first_round_over
    assert outcome.result == DrainJobResult.DRAINED and outcome.drained == tuple(ids)
    assert slow.refused == [ActivationCallbackRejected.CLOSED]


# -- a removal finishes even when a report fails -------------------------------------------------


def test_a_removal_report_goes_on_past_the_delivery_attempts_until_the_job_hears_it(
    run, script, monkeypatch
):
    cluster = InProcessCluster(options=JobsOptions(step_delivery_max_attempts=2))
    script.behaviour["a"].block = True
    tries: list[int] = []

    async def scenario():
        async with cluster:
            deliver = cluster.report

            async def unreachable(job_key, job_id, reports):
                tries.append(len(reports))
                if len(tries) <= 6:
                    raise StorageUnavailableError("the job cannot be reached")
                await deliver(job_key, job_id, reports)

            result = await cluster.start(ScenarioJob, request("a"))
            await cluster.settle()
            monkeypatch.setattr(cluster, "report", unreachable)
            await cluster.manager().remove(result.job_id)
            for _ in range(8):
                await cluster.clock.advance(60)
            await cluster.settle()
            return await cluster.storage().jobs.find(result.job_id)

    stored = run(scenario())
    assert len(tries) == 7  # past the two delivery attempts, until heard
    assert stored is None


class FailingClears(WriteFaults):
    """Storage whose first `times` deletions of a job's steps (a removal's clear) fail."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.times = times

    def _check(self, what: str) -> None:
        if what == "steps.remove_all_for_job" and self.times > 0:
            self.times -= 1
            self.writes += 1
            self.log.append(what)
            raise StorageUnavailableError("injected failure: clearing the job")
        super()._check(what)


def answered_reports(cluster, monkeypatch) -> list[tuple[float, Any]]:
    """Every report batch the worker sends, with when it was answered and how: None for
    success, else the error's code."""
    deliver = cluster.report
    start = cluster.clock.now()
    answers: list[tuple[float, Any]] = []

    def elapsed() -> float:
        return (cluster.clock.now() - start).total_seconds()

    async def report(job_key, job_id, reports):
        try:
            await deliver(job_key, job_id, reports)
        except Exception as error:
            answers.append((elapsed(), getattr(error, "code", type(error))))
            raise
        answers.append((elapsed(), None))

    monkeypatch.setattr(cluster, "report", report)
    return answers


async def removing_one_step(cluster: InProcessCluster, monkeypatch: Any) -> tuple[Any, Any, Any]:
    """A one-step job whose step blocks, removed; the job's answers to reports recorded."""
    answers = answered_reports(cluster, monkeypatch)
    result = await cluster.start(ScenarioJob, request("a"))
    await cluster.settle()
    activation = cluster.manager().activation(result.job_id)
    await cluster.manager().remove(result.job_id)
    return answers, result, activation


def test_a_failed_removal_finish_answers_the_report_with_an_error_and_its_next_report_finishes_it(
    run, script, monkeypatch
):
    """The seed: clearing the job fails, so the step's report is answered with an error; the
    step reports again (after the delivery delay, here 0.5 s: before the job's own timer at
    1 s), which runs the finish again, and the job is cleared. The step counts once."""
    faults = FailingClears(times=1)
    cluster = InProcessCluster(
        options=JobsOptions(step_delivery_retry_delay=timedelta(seconds=0.5)),
        wrap_storage=faults.wrap,
    )
    script.behaviour["a"].block = True

    async def scenario():
        async with cluster:
            answers, result, activation = await removing_one_step(cluster, monkeypatch)
            await cluster.settle()
            failed = await cluster.storage().jobs.find(result.job_id)
            await cluster.advance(0.5)  # the step's next report: the job's timer is not due
            cleared = await cluster.storage().jobs.find(result.job_id)
            steps = await cluster.storage().steps.count_for_job(result.job_id)
            await cluster.advance(120)  # the timer finds nothing left to finish
            return answers, failed, cleared, steps, activation.counters

    answers, failed, cleared, steps, counters = run(scenario())
    assert answers == [(0.0, RemoveJobError.UNKNOWN), (0.5, None)]
    assert failed is not None and failed.status == JobStatus.REMOVING
    assert cleared is None and steps == 0
    assert faults.log.count("steps.remove_all_for_job") == 2
    assert script.hooks.count("on_stopped") == 2  # a failed finish runs it again
    assert script.hooks.count("on_step_completed_or_stopped") == 1
    assert counters.ignored_reports == 1  # the second report is not counted again


def test_a_report_to_a_removing_job_busy_past_half_the_call_bound_is_queued_and_answered(
    run, script, monkeypatch
):
    """A removal report waits for the job's turn at most half of `host_call_timeout` (10 s):
    a turn held longer (a worker that does not answer, a slow hook) must not make the worker
    take the controller for gone. The report is then queued, answered, and counted once the
    turn is free; the removal finishes."""
    cluster = InProcessCluster()
    script.behaviour["a"].block = True

    async def scenario():
        async with cluster:
            answers, result, activation = await removing_one_step(cluster, monkeypatch)
            turn = activation._core.turn
            await turn.acquire()  # the job is busy: its turn is held
            for _ in range(200):  # the step stops, writes its removal and reports it
                await asyncio.sleep(0)
            await cluster.clock.advance(4.9)
            early = list(answers)
            await cluster.clock.advance(0.1)
            for _ in range(20):
                await asyncio.sleep(0)
            answered = list(answers)
            turn.release()
            await cluster.settle()
            return early, answered, await cluster.storage().jobs.find(result.job_id)

    early, answered, cleared = run(scenario())
    assert early == []
    assert answered == [(5.0, None)]
    assert cleared is None
    assert script.hooks.count("on_step_completed_or_stopped") == 1


def test_a_failed_removal_finish_is_retried_by_the_job_until_the_job_is_cleared(run, script):
    """on_stopped throws: the job retries the finish on its own timer (1 s doubling to 60 s),
    with no report to trigger it (the worker's next one is an hour away); Remove() on the job
    runs the finish again and answers Unknown while it fails, and the job is cleared once it
    does not."""
    cluster = InProcessCluster(
        options=JobsOptions(
            step_delivery_retry_delay=timedelta(hours=1),
            max_step_delivery_retry_delay=timedelta(hours=1),
        )
    )
    script.fail_hooks.add("on_stopped")
    script.behaviour["a"].block = True

    async def scenario():
        async with cluster:
            result = await cluster.start(ScenarioJob, request("a"))
            await cluster.settle()
            await cluster.manager().remove(result.job_id)
            await cluster.settle()
            first = script.hooks.count("on_stopped")
            await cluster.advance(1)
            await cluster.advance(2)
            retried = script.hooks.count("on_stopped")
            with pytest.raises(RemoveJobFailed) as failing:
                await cluster.manager().remove(result.job_id)
            still = await cluster.storage().jobs.find(result.job_id)
            script.fail_hooks.clear()
            await cluster.advance(4)
            cleared = await cluster.storage().jobs.find(result.job_id)
            steps = await cluster.storage().steps.count_for_job(result.job_id)
            return first, retried, failing.value.code, still, cleared, steps

    first, retried, code, still, cleared, steps = run(scenario())
    assert first == 1 and retried == 3
    assert code == RemoveJobError.UNKNOWN
    assert still is not None and still.status == JobStatus.REMOVING
    assert cleared is None and steps == 0
    assert script.hooks.count("on_step_completed_or_stopped") == 1


def test_the_jobs_finish_timer_doubles_to_sixty_seconds_past_the_delivery_attempts(
    run, script, monkeypatch
):
    """The job's own retries of a failed removal finish are not bounded by
    `step_delivery_max_attempts` (2 here): 1 s doubling to 60 s, until the job is cleared."""
    cluster = InProcessCluster(
        options=JobsOptions(
            step_delivery_max_attempts=2,
            step_delivery_retry_delay=timedelta(hours=1),
            max_step_delivery_retry_delay=timedelta(hours=1),
        )
    )
    script.behaviour["a"].block = True
    tries: list[float] = []

    def on_stopped(self) -> None:
        tries.append((cluster.clock.now() - begun).total_seconds())
        if len(tries) < 10:
            raise RuntimeError("on_stopped failed on purpose")

    monkeypatch.setattr(ScenarioJob, "on_stopped", on_stopped)
    begun = cluster.clock.now()

    async def scenario():
        async with cluster:
            result = await cluster.start(ScenarioJob, request("a"))
            await cluster.settle()
            await cluster.manager().remove(result.job_id)
            for _ in range(8):
                await cluster.advance(60)
            return await cluster.storage().jobs.find(result.job_id)

    cleared = run(scenario())
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert gaps == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert cleared is None


class MixedJob(ScenarioJob, name="tests.stopping.mixed-job"):
    """A step that stops at once ("a") and one slow to stop ("slow")."""

    def prepare_steps(self, request: Any) -> list[Any]:
        return [
            self.create_step(KeyStep, KeyRequest(key="a"), name="a"),
            self.create_step(SlowToStopStep, KeyRequest(key="slow"), name="slow"),
        ]


def test_a_step_being_removed_deletes_its_own_record_once_the_job_stored_its_stop(
    run, cluster, script, slow
):
    """The recovery seed: a removed step deletes its own record once the job has accepted
    (stored) its stop, without waiting for the job to be cleared; the job, still waiting for
    its slow step, keeps that one's record."""
    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(MixedJob, request())
        await cluster.settle()
        await cluster.manager().remove(result.job_id)
        await cluster.settle()
        job = await cluster.storage().jobs.get(result.job_id)
        left = await cluster.storage().steps.get_for_job(result.job_id)
        slow.finish.set()
        await cluster.settle()
        cleared = await cluster.storage().jobs.find(result.job_id)
        return job, left, cleared, await cluster.storage().steps.count_for_job(result.job_id)

    job, left, cleared, steps = run(scenario())
    assert job.status == JobStatus.REMOVING and job.progress.stopped_steps == 1
    assert [step.name for step in left] == ["slow"]
    assert cleared is None and steps == 0


class FailingJobSave(WriteFaults):
    """Job storage whose next save fails once `armed`."""

    armed = False

    def _check(self, what: str) -> None:
        if what == "jobs.save" and self.armed:
            self.armed = False
            self.writes += 1
            raise StorageUnavailableError("injected failure: saving the job")
        super()._check(what)


def test_a_removal_report_the_job_could_not_store_is_answered_with_an_error_and_sent_again(
    run, script, slow, monkeypatch
):
    """The job counts a removed step's stop but cannot write it: the step is answered with
    an error, so it keeps its record and reports again (to the job's next activation), and
    deletes its record only once that report is stored."""
    faults = FailingJobSave()
    cluster = InProcessCluster(options=JobsOptions(max_parallel_steps=8), wrap_storage=faults.wrap)
    script.behaviour["a"].block = True

    async def scenario():
        async with cluster:
            answers = answered_reports(cluster, monkeypatch)
            result = await cluster.start(MixedJob, request())
            await cluster.settle()
            await cluster.manager().remove(result.job_id)
            faults.armed = True
            await cluster.settle()
            kept = sorted(s.name for s in await cluster.storage().steps.get_for_job(result.job_id))
            first = list(answers)
            await cluster.advance(1)  # the step's next report
            left = [s.name for s in await cluster.storage().steps.get_for_job(result.job_id)]
            slow.finish.set()
            await cluster.settle()
            return first, kept, left, await cluster.storage().jobs.find(result.job_id)

    first, kept, left, cleared = run(scenario())
    assert first == [(0.0, RemoveJobError.UNKNOWN)]
    assert kept == ["a", "slow"]
    assert left == ["slow"]
    assert cleared is None


def test_remove_on_a_job_being_removed_answers_that_it_is_already_being_removed(
    run, cluster, script, slow
):
    async def scenario():
        job_id, _ = await running_step(cluster, "a")
        await cluster.manager().remove(job_id)  # the step is slow to stop
        with pytest.raises(RemoveJobFailed) as again:
            await cluster.manager().remove(job_id)
        slow.finish.set()
        await cluster.settle()
        return again.value.code, await cluster.storage().jobs.find(job_id)

    code, stored = run(scenario())
    assert code == RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED
    assert stored is None


# -- a failed resume hook can leave a stopped job ready to retry ---------------------------------


def test_a_failed_resume_hook_does_not_compensate_a_stop_whose_workers_have_not_all_reported(
    run, cluster, script, monkeypatch
):
    """Eligibility uses the pre-resume accounting: with a step still unaccounted for (its stop
    notification never got through), work may be live, so the job is not put back to Stopped
    and stays Running for the watchdog or a later Resume()."""
    global START
    script.behaviour["a"].block = True
    monkeypatch.setattr(cluster, "stop_steps", FailingStops(cluster, times=1000))

    async def scenario():
        global START
        START = cluster.clock.now()
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        script.fail_hooks.add("on_before_resuming_job_steps")
        with pytest.raises(ResumeJobFailed):
            await cluster.manager().resume(result.job_id)
        stored = await cluster.storage().jobs.get(result.job_id)
        script.fail_hooks.clear()
        script.release("a")
        return stored

    stored = run(scenario())
    assert stored.status == JobStatus.RUNNING
    assert "on_stopped" not in script.hooks


def test_a_finalized_stop_deletes_the_jobs_stored_plan(run, script):
    script.behaviour["a"].block = True
    cluster = InProcessCluster(options=JobsOptions(max_inline_step_plan_size=0))

    async def scenario():
        async with cluster:
            result = await cluster.start(ScenarioJob, request("a", "b"))
            await cluster.settle()
            stored = await cluster.storage().jobs.get(result.job_id)
            incarnation = stored.stored_step_plan_incarnation
            await cluster.manager().stop(result.job_id)
            await cluster.settle()
            state = await cluster.storage().jobs.get(result.job_id)
            try:
                plan = await whole_plan(cluster.storage().plans, result.job_id, incarnation)
            except Exception:
                plan = None
            return incarnation, state, plan

    incarnation, state, plan = run(scenario())
    assert incarnation is not None
    assert state.stop_finalized
    assert not plan


# -- write order: persisted first, and no refused stop stands as the outcome ---------------------


def test_a_refused_late_stop_of_an_earlier_execution_does_not_stand_in_step_storage(
    run, cluster, script, slow
):
    """Persist-first hazard: the first execution's run persists its stop after the job was
    resumed; the job refuses that report, and the resumed run's outcome replaces it."""
    slow.later_runs_succeed = True

    async def scenario():
        job_id, _ = await running_step(cluster, "a")
        await cluster.manager().stop(job_id)
        await cluster.settle()
        await cluster.manager().resume(job_id)  # the stop is still in progress
        await cluster.settle()
        slow.finish.set()  # the old run persists Stopped and reports it, late
        state = await cluster.wait(job_id)
        steps = await cluster.storage().steps.get_for_job(job_id)
        return state, steps

    state, [step] = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert (state.progress.successful_steps, state.progress.stopped_steps) == (1, 0)
    assert step.status == JobStepStatus.COMPLETED_SUCCESSFULLY and step.generation == 2


def test_a_stop_the_running_job_did_not_ask_for_does_not_stand_in_step_storage(
    run, cluster, script
):
    """Persist-first hazard: a run stopped without the job asking (its worker cancelled it)
    persists Stopped; the running job refuses to count it and runs the step again."""
    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        [step] = await cluster.storage().steps.get_for_job(result.job_id)
        await cluster.worker.stop_steps(stop_request(result.job_id, [step.id]))
        await cluster.settle()
        script.release("a")
        state = await cluster.wait(result.job_id)
        return state, await cluster.storage().steps.get_for_job(result.job_id)

    state, [step] = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.stopped_steps == 0
    assert step.status == JobStepStatus.COMPLETED_SUCCESSFULLY
    assert script.ran("a") == 2


def test_a_stop_counted_for_a_step_whose_run_then_succeeds_is_taken_back_in_the_same_write(
    run, cluster, script, monkeypatch
):
    """The job counted a stop for a step no worker said it ran, and the step's run then
    succeeds: the job takes the stop back and counts the success, so its counts equal step
    storage."""
    from choreography_ray.engine.messages import StopResult

    script.behaviour["a"].block = True

    async def unheard(request):  # the worker running `a` did not hear the stop
        return StopResult(stopping=[], not_running=list(request.step_ids or ()))

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        monkeypatch.setattr(cluster, "stop_steps", unheard)
        await cluster.manager().stop(result.job_id)
        await cluster.settle()
        counted = await cluster.storage().jobs.get(result.job_id)
        script.release("a")  # the run goes on, and succeeds
        await cluster.settle()
        state = await cluster.storage().jobs.get(result.job_id)
        steps = await cluster.storage().steps.get_for_job(result.job_id)
        return counted, state, steps

    counted, state, [step] = run(scenario())
    assert counted.progress.stopped_steps == 1
    assert step.status == JobStepStatus.COMPLETED_SUCCESSFULLY
    assert (state.progress.successful_steps, state.progress.stopped_steps) == (1, 0)
    assert state.stopped_steps_counted == []


@pytest.mark.parametrize("failing", ["the resume write", "the compensating write"])
def test_an_eligible_stopped_job_retires_when_the_resume_or_compensating_write_fails(
    run, script, failing
):
    """Rather than serve an uncertain state, the activation lets the job go; what storage
    holds is whichever status reached it."""
    faults = WriteFaults()
    cluster = InProcessCluster(wrap_storage=faults.wrap)
    script.behaviour["a"].block = True

    async def scenario():
        async with cluster:
            result = await cluster.start(ScenarioJob, request("a"))
            await cluster.settle()
            await cluster.manager().stop(result.job_id)
            await cluster.settle()
            activation = cluster.manager().activation(result.job_id)
            script.fail_hooks.add("on_before_resuming_job_steps")
            faults.fail_at = {faults.writes + (1 if failing == "the resume write" else 2)}
            with pytest.raises(ResumeJobFailed):
                await cluster.manager().resume(result.job_id)
            return activation.released, await cluster.storage().jobs.get(result.job_id)

    released, stored = run(scenario())
    assert released
    expected = JobStatus.STOPPED if failing == "the resume write" else JobStatus.RUNNING
    assert stored.status == expected


def test_draining_a_finished_stop_answers_drained_without_running_the_hooks_again(
    run, cluster, script
):
    script.behaviour["a"].block = True

    async def scenario():
        result = await cluster.start(ScenarioJob, request("a"))
        await cluster.settle()
        await cluster.manager().stop(result.job_id)
        await cluster.settle()
        return await cluster.manager().drain(result.job_id, within=5)

    outcome = run(scenario())
    assert outcome.result == DrainJobResult.DRAINED
    assert script.hooks.count("on_stopped") == 1


# -- a live run of the current execution is told, once, that the job is removed ------------------


class RecordedStops:
    """Stop notifications that reach the workers, recorded; the first `failing` fail."""

    def __init__(self, cluster, failing: int = 0) -> None:
        self.cluster = cluster
        self.worker_stop = functools.partial(InProcessCluster.stop_steps, cluster)
        self.failing = failing
        self.delivered: list[StopRequest] = []

    async def __call__(self, request: StopRequest) -> StopResult:
        if self.failing > 0:
            self.failing -= 1
            raise StorageUnavailableError("the worker cannot be reached")
        self.delivered.append(request)
        return await self.worker_stop(request)

    def naming(self, step_id: str) -> list[tuple[int, bool]]:
        """(generation, removing) of every delivered notification that names the step."""
        return [(r.generation, r.removing) for r in self.delivered if step_id in (r.step_ids or ())]


def lose_the_controller(cluster) -> None:
    """The job's controller goes away, writing nothing more; the workers live on."""
    key = JobKey()
    cluster.managers.pop(key).close()


async def a_resumed_run_waiting_behind_an_earlier_stop(cluster) -> tuple[str, str]:
    """A job whose step `a` stopped (stored Stopped, execution 1) and was started again by a
    resume (execution 2), its run queued behind another job's step `x` that holds the worker's
    only slot: the record still says Stopped of execution 1 while the run of execution 2 lives.
    Returns the job's id and the step's id."""
    result = await cluster.start(ScenarioJob, request("a"))
    await cluster.settle()
    await cluster.manager().stop(result.job_id)
    await cluster.settle()
    await cluster.start(ScenarioJob, request("x"))
    await cluster.settle()
    await cluster.manager().resume(result.job_id)
    await cluster.settle()
    [step] = await cluster.storage().steps.get_for_job(result.job_id)
    assert step.status == JobStepStatus.STOPPED and step.generation == 1
    assert [run.generation for run in cluster.worker.runs_of(result.job_id)] == [2]
    return result.job_id, step.id


async def written_but_untold(cluster: InProcessCluster, monkeypatch: Any, operation: str):
    """A resumed run waits behind an earlier execution's stop; the job is then stopped or
    removed (`operation`), written but with no worker told, and its controller is lost."""
    job_id, step_id = await a_resumed_run_waiting_behind_an_earlier_stop(cluster)
    monkeypatch.setattr(cluster, "stop_steps", RecordedStops(cluster, failing=1000))
    await getattr(cluster.manager(), operation)(job_id)
    lose_the_controller(cluster)
    return job_id, step_id


def test_a_live_run_of_the_current_execution_is_told_once_that_the_job_is_removed(
    run, script, monkeypatch
):
    """The seed: the earlier execution's stop counts (recovery finishes the removal from step
    storage), and the run of the current execution that may still be live is told, once, that
    the job is removed: it stops without performing, its stop is already counted, and the job
    is cleared. Without the notice the run would perform after the job was gone."""
    cluster = InProcessCluster(max_parallel_steps=1)
    script.behaviour["a"].block = True
    script.behaviour["x"].block = True

    async def scenario():
        async with cluster:
            job_id, step_id = await written_but_untold(cluster, monkeypatch, "remove")
            stops = RecordedStops(cluster, failing=1)  # the first notice fails: sent again
            monkeypatch.setattr(cluster, "stop_steps", stops)
            await (await cluster.manager().rehydrate())
            await cluster.settle()
            waiting_for_the_notice = await cluster.storage().jobs.find(job_id)
            await cluster.advance(1)  # the notice goes out again and reaches the worker
            left = cluster.worker.runs_of(job_id)
            cleared = await cluster.storage().jobs.find(job_id)
            await cluster.advance(120)
            script.release("x")  # the slot frees: a run still queued would perform now
            await cluster.settle()
            return step_id, stops, waiting_for_the_notice, left, cleared

    step_id, stops, waiting, left, cleared = run(scenario())
    assert waiting is not None and waiting.status == JobStatus.REMOVING
    assert stops.naming(step_id) == [(2, True)]  # once, to the current execution's run
    assert left == [] and cleared is None
    assert script.ran("a") == 1  # only the first execution's run performed
    assert script.hooks.count("on_stopped") == 2  # the first stop's, and the removal's


def test_a_live_run_of_the_current_execution_is_told_once_that_the_job_stopped(
    run, script, monkeypatch
):
    """The same for a stop finished by a new activation: the run is told to stop (not that
    the job is removed), the earlier stop counts once, and `on_stopped` runs only once the
    notice got through, so no work of the job runs after it."""
    cluster = InProcessCluster(max_parallel_steps=1)
    script.behaviour["a"].block = True
    script.behaviour["x"].block = True

    async def scenario():
        async with cluster:
            job_id, step_id = await written_but_untold(cluster, monkeypatch, "stop")
            stops = RecordedStops(cluster)
            monkeypatch.setattr(cluster, "stop_steps", stops)
            await (await cluster.manager().rehydrate())
            await cluster.settle()
            left = cluster.worker.runs_of(job_id)
            script.release("x")
            await cluster.settle()
            return step_id, stops, left, await cluster.storage().jobs.get(job_id)

    step_id, stops, left, state = run(scenario())
    assert stops.naming(step_id) == [(2, False)]
    assert left == []
    assert state.stop_finalized and state.progress.stopped_steps == 1
    assert script.ran("a") == 1
    assert script.hooks.count("on_stopped") == 2  # the first execution's stop, and this one


def test_a_run_told_that_the_job_is_removed_is_not_told_again_by_a_later_pass(
    run, script, monkeypatch
):
    """Once per run: the finish fails (on_stopped throws), so the job is still being removed
    when recovery passes over it again; that pass counts the earlier stop again from storage
    but does not tell the run a second time."""
    cluster = InProcessCluster(max_parallel_steps=1)
    script.behaviour["a"].block = True
    script.behaviour["x"].block = True

    async def scenario():
        async with cluster:
            job_id, step_id = await written_but_untold(cluster, monkeypatch, "remove")
            stops = RecordedStops(cluster)
            monkeypatch.setattr(cluster, "stop_steps", stops)
            script.fail_hooks.add("on_stopped")
            await (await cluster.manager().rehydrate())
            await cluster.settle()
            await (await cluster.manager().rehydrate())  # a later pass: still being removed
            await cluster.settle()
            still = await cluster.storage().jobs.find(job_id)
            script.fail_hooks.clear()
            await cluster.advance(60)
            return step_id, stops, still, await cluster.storage().jobs.find(job_id)

    step_id, stops, still, cleared = run(scenario())
    assert still is not None and still.status == JobStatus.REMOVING
    assert stops.naming(step_id) == [(2, True)]
    assert cleared is None


def test_a_stop_counted_from_the_current_execution_sends_no_notice(run, script, monkeypatch):
    """Only a stop of an earlier execution leaves a run of this one that may live: a stop the
    current execution stored was its run's own end, and no one is told again."""
    cluster = InProcessCluster()
    script.behaviour["a"].block = True

    async def scenario():
        async with cluster:
            result = await cluster.start(ScenarioJob, request("a"))
            await cluster.settle()
            await cluster.manager().stop(result.job_id)
            await cluster.settle()
            [step] = await cluster.storage().steps.get_for_job(result.job_id)
            lose_the_controller(cluster)
            stops = RecordedStops(cluster)
            monkeypatch.setattr(cluster, "stop_steps", stops)
            await cluster.manager().remove(result.job_id)  # a new activation, from storage
            await cluster.settle()
            return stops, step, await cluster.storage().jobs.find(result.job_id)

    stops, step, cleared = run(scenario())
    assert step.generation == 1
    assert stops.naming(step.id) == []
    assert cleared is None


def test_a_drain_completed_by_a_new_activation_asks_the_live_run_of_the_current_execution(
    run, script, monkeypatch
):
    """The pending drain of an execution whose step stopped in an earlier one: the new
    activation asks that step's live run to stop and answer, and the drain completes."""
    cluster = InProcessCluster(max_parallel_steps=1)
    script.behaviour["a"].block = True
    script.behaviour["x"].block = True

    async def scenario():
        async with cluster:
            job_id, _ = await a_resumed_run_waiting_behind_an_earlier_stop(cluster)

            async def unreachable(request: StopRequest, within: float | None = None) -> Any:
                raise StorageUnavailableError("the worker cannot be reached")

            monkeypatch.setattr(cluster, "stop_and_wait", unreachable)
            monkeypatch.setattr(cluster, "stop_steps", unreachable)
            outcome = await cluster.manager().drain(job_id, within=5)
            lose_the_controller(cluster)
            monkeypatch.undo()
            finishing = await cluster.manager().activate(job_id)
            await finishing.finish_stop()
            await cluster.settle()
            state = await cluster.storage().jobs.get(job_id)
            left = cluster.worker.runs_of(job_id)
            script.release("x")
            await cluster.settle()
            return outcome, state, left

    outcome, state, left = run(scenario())
    assert outcome.result == DrainJobResult.TIMED_OUT
    assert state.stop_finalized and not state.pending_drain
    assert state.progress.stopped_steps == 1
    assert left == []
    assert script.ran("a") == 1


def test_a_drains_notice_that_did_not_get_through_is_sent_again(run, script, monkeypatch):
    """The new activation's drain cannot reach the workers: the live run of the current
    execution was not told, so the notice goes out again with the stop notifications (1 s
    later), the run stops, and the stop is finalized only then."""
    cluster = InProcessCluster(max_parallel_steps=1)
    script.behaviour["a"].block = True
    script.behaviour["x"].block = True

    async def unreachable(request: StopRequest, within: float | None = None) -> Any:
        raise StorageUnavailableError("the worker cannot be reached")

    async def scenario():
        async with cluster:
            job_id, step_id = await a_resumed_run_waiting_behind_an_earlier_stop(cluster)
            monkeypatch.setattr(cluster, "stop_and_wait", unreachable)
            monkeypatch.setattr(cluster, "stop_steps", unreachable)
            await cluster.manager().drain(job_id, within=5)
            lose_the_controller(cluster)
            finishing = await cluster.manager().activate(job_id)
            await finishing.finish_stop()  # its drain fails to reach the workers too
            await cluster.settle()
            before = await cluster.storage().jobs.get(job_id)
            stops = RecordedStops(cluster)
            monkeypatch.setattr(cluster, "stop_steps", stops)
            await cluster.advance(1)
            left = cluster.worker.runs_of(job_id)
            script.release("x")
            await cluster.settle()
            return step_id, before, stops, left, await cluster.storage().jobs.get(job_id)

    step_id, before, stops, left, state = run(scenario())
    assert not before.stop_finalized
    assert stops.naming(step_id) == [(2, False)]
    assert left == []
    assert state.stop_finalized and not state.pending_drain
    assert script.ran("a") == 1


def test_a_drain_does_not_notice_again_a_run_a_round_already_told(run, script, monkeypatch):
    """Once per run: the new activation's first drain round reaches the worker (the run is
    told; here its answer says it timed out), the next round fails; the notice is not sent
    again, and the run's report, already counted, finishes the drain."""
    cluster = InProcessCluster(max_parallel_steps=1)
    script.behaviour["a"].block = True
    script.behaviour["x"].block = True
    rounds: list[int] = []

    async def first_told_then_unreachable(request: StopRequest, within: float) -> Any:
        rounds.append(len(request.step_ids or ()))
        if len(rounds) > 1:
            raise StorageUnavailableError("the worker cannot be reached")
        answer = await InProcessCluster.stop_and_wait(cluster, request, within)
        answer.timed_out.extend(report.step_id for report in answer.settled)
        answer.settled.clear()
        return answer

    async def scenario():
        async with cluster:
            job_id, step_id = await a_resumed_run_waiting_behind_an_earlier_stop(cluster)

            async def unreachable(request: StopRequest, within: float | None = None) -> Any:
                raise StorageUnavailableError("the worker cannot be reached")

            monkeypatch.setattr(cluster, "stop_and_wait", unreachable)
            monkeypatch.setattr(cluster, "stop_steps", unreachable)
            await cluster.manager().drain(job_id, within=5)
            lose_the_controller(cluster)
            monkeypatch.setattr(cluster, "stop_and_wait", first_told_then_unreachable)
            stops = RecordedStops(cluster)
            monkeypatch.setattr(cluster, "stop_steps", stops)
            finishing = await cluster.manager().activate(job_id)
            await finishing.finish_stop()
            await cluster.advance(120)
            return step_id, stops, await cluster.storage().jobs.get(job_id)

    step_id, stops, state = run(scenario())
    assert len(rounds) == 2
    assert stops.naming(step_id) == []
    assert state.stop_finalized and not state.pending_drain
    assert script.ran("a") == 1
