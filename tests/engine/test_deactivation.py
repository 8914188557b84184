"""A worker host that shuts down (the stopping seed's deactivation): it cancels the work of its
steps and waits for it, and for the callbacks it started, within one deadline; it writes no
final status and reports nothing, so the steps stay Running for recovery."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from choreography_ray.engine.clock import settle
from choreography_ray.engine.run_host import CallbackRejected
from choreography_ray.jobs import JobsOptions, JobStepStatus
from choreography_ray.jobs.errors import ActivationCallbackRejected
from choreography_ray.jobs.step import JobStep, StepCancelled, StepContext
from choreography_ray.testing import InProcessCluster

from .fixtures import KeyRequest, KeyResult, KeyState, ScenarioJob, held_steps, request


class Reluctant:
    """What the steps here do once asked to stop: go on until `finish` is set, then
    checkpoint (a callback during the wait) and end stopped."""

    def __init__(self) -> None:
        self.finish = asyncio.Event()
        self.thread_finish = threading.Event()
        self.ended = threading.Event()
        self.checkpoints: list[str] = []


RELUCTANT = Reluctant()


@pytest.fixture
def reluctant() -> Iterator[Reluctant]:
    global RELUCTANT
    RELUCTANT = Reluctant()
    yield RELUCTANT
    RELUCTANT.finish.set()
    RELUCTANT.thread_finish.set()


def _checkpoint(ctx: StepContext, state: KeyState) -> None:
    state.progress += 1
    try:
        ctx.checkpoint(state)
        RELUCTANT.checkpoints.append("accepted")
    except CallbackRejected as refused:
        RELUCTANT.checkpoints.append(ActivationCallbackRejected(refused.code).name)


class ReluctantStep(JobStep[KeyRequest, KeyState, KeyResult], name="tests.deactivation.step"):
    async def perform(self, state: KeyState, ctx: StepContext) -> KeyResult:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            while not RELUCTANT.finish.is_set():
                try:
                    await RELUCTANT.finish.wait()
                except asyncio.CancelledError:
                    continue
        _checkpoint(ctx, state)
        RELUCTANT.ended.set()
        raise StepCancelled()

    def initialize_state(self, request: KeyRequest) -> KeyState:
        return KeyState(key=request.key)


class ReluctantSyncStep(JobStep[KeyRequest, KeyState, int], name="tests.deactivation.sync"):
    def perform(self, state: KeyState, ctx: StepContext) -> int:
        while not ctx.cancelled:
            time.sleep(0.001)
        RELUCTANT.thread_finish.wait(10)
        _checkpoint(ctx, state)
        RELUCTANT.ended.set()
        raise StepCancelled()

    def initialize_state(self, request: KeyRequest) -> KeyState:
        return KeyState(key=request.key)


class ReluctantWritingStep(ReluctantStep, name="tests.deactivation.writing"):
    checkpoint_after_every_batch = True


STEPS: dict[str, type[JobStep[Any, Any, Any]]] = {
    "sync": ReluctantSyncStep,
    "writing": ReluctantWritingStep,
}


class ReluctantJob(ScenarioJob, name="tests.deactivation.job"):
    def prepare_steps(self, request: Any) -> list[Any]:
        return [
            self.create_step(STEPS.get(k, ReluctantStep), KeyRequest(key=k), name=k)
            for k in request.keys
        ]


async def _running(cluster: Any, monkeypatch: Any, key: str) -> tuple[str, list[Any]]:
    """A job whose one step performs; every report the worker sends is kept from the job."""
    reports: list[Any] = []

    async def report(job_key, job_id, batch):
        reports.extend(batch)

    monkeypatch.setattr(cluster, "report", report)
    result = await cluster.start(ReluctantJob, request(key))
    if key == "sync":  # its thread works until cancelled: the cluster would never settle
        for _ in range(10_000):
            if cluster.worker.sync_runner.in_flight:
                break
            await asyncio.sleep(0.001)
    else:
        await cluster.settle()
    return result.job_id, reports


def test_deactivation_waits_for_the_work_and_its_callbacks_and_writes_no_final_status(
    run, cluster, reluctant, monkeypatch
):
    async def scenario():
        job_id, reports = await _running(cluster, monkeypatch, "a")
        closing = asyncio.ensure_future(cluster.worker.deactivate(10))
        await cluster.settle()
        waiting = not closing.done()
        reluctant.finish.set()  # the work settles: it checkpoints, then ends
        await cluster.settle()
        [step] = await cluster.storage().steps.get_for_job(job_id)
        return waiting, closing.done(), step, reports

    waiting, closed, step, reports = run(scenario())
    assert waiting and closed
    assert reluctant.checkpoints == ["accepted"]  # the callback during the wait was served
    assert step.status == JobStepStatus.RUNNING  # no final status: recovery runs it again
    assert reports == []


def test_deactivation_waits_no_longer_than_its_deadline_and_then_refuses_callbacks(
    run, cluster, reluctant, monkeypatch
):
    async def scenario():
        job_id, reports = await _running(cluster, monkeypatch, "a")
        closing = asyncio.ensure_future(cluster.worker.deactivate(10))
        await settle()  # the deadline starts now
        await cluster.clock.advance(9.9)
        early = closing.done()
        await cluster.clock.advance(0.1)
        await cluster.settle()
        late = closing.done()
        reluctant.finish.set()  # the work settles after the deadline
        await cluster.settle()
        [step] = await cluster.storage().steps.get_for_job(job_id)
        return early, late, step, reports

    early, late, step, reports = run(scenario())
    assert (early, late) == (False, True)
    assert reluctant.checkpoints == ["CLOSED"]
    assert step.status == JobStepStatus.RUNNING
    assert reports == []


def test_deactivation_waits_for_a_synchronous_steps_thread(run, cluster, reluctant, monkeypatch):
    async def scenario():
        job_id, reports = await _running(cluster, monkeypatch, "sync")
        closing = asyncio.ensure_future(cluster.worker.deactivate(10))
        await asyncio.sleep(0.05)
        waiting = not closing.done()
        reluctant.thread_finish.set()
        await asyncio.wait_for(closing, 10)
        ended = reluctant.ended.is_set()  # the thread's work was over when it returned
        [step] = await cluster.storage().steps.get_for_job(job_id)
        return waiting, ended, step, reports

    waiting, ended, step, reports = run(scenario())
    assert waiting and ended
    assert reluctant.checkpoints == ["accepted"]
    assert step.status == JobStepStatus.RUNNING
    assert reports == []


def test_deactivation_lets_a_write_under_way_land_before_it_closes(run, reluctant, monkeypatch):
    """The work checkpoints as it stops (written at once) and ends; deactivation waits for
    that write too, rather than cancelling it as storage closes."""
    writes, wrap = held_steps(lambda _: False)
    cluster = InProcessCluster(options=JobsOptions(max_parallel_steps=8), wrap_storage=wrap)

    async def scenario():
        async with cluster:
            job_id, _ = await _running(cluster, monkeypatch, "writing")
            [steps] = writes
            steps.holds = lambda _: True
            closing = asyncio.ensure_future(cluster.worker.deactivate(10))
            reluctant.finish.set()  # the work checkpoints (the write waits) and ends
            await settle()
            waiting = not closing.done() and reluctant.ended.is_set()
            steps.go.set()
            await asyncio.wait_for(closing, 10)
            [step] = await cluster.storage().steps.get_for_job(job_id)
            return waiting, step

    waiting, step = run(scenario())
    assert waiting
    assert step.status == JobStepStatus.RUNNING and step.state is not None
    assert step.state.data["progress"] == 1  # the checkpoint landed
