"""What the Ray dispatcher answers for stops when a worker host does not answer (no Ray: the
routing table is a stand-in)."""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.engine.messages import SettledStops, StepReport, StopRequest, StopResult
from choreography_ray.jobs import HostError, JobKey, JobStepStatus
from choreography_ray.runtime.dispatch import RayDispatcher

from .host_stubs import TableStub


class Routes(TableStub):
    """Two worker hosts; `w2` does not answer."""

    workers = ["w1", "w2"]

    async def answer(self, name: str, method: str, args: tuple[object, ...]) -> object:
        if name == "w2":
            raise TimeoutError("no answer within 10s")
        if method == "stop_steps":
            return StopResult(stopping=["a"])
        return SettledStops(settled=[StepReport("a", JobStepStatus.STOPPED, 1, 1)])


REQUEST = StopRequest(JobKey(), "job", generation=1, step_ids=("a", "b"))


def test_a_stop_a_worker_host_did_not_answer_fails_so_the_job_tells_every_host_again():
    """Its runs may still work: none of its steps is taken as not running."""
    dispatcher = RayDispatcher(Routes(), controller="c")  # type: ignore[arg-type]
    with pytest.raises(HostError):
        asyncio.run(dispatcher.stop_steps(REQUEST))


def test_a_drain_counts_the_steps_a_silent_worker_host_may_run_as_not_answered():
    dispatcher = RayDispatcher(Routes(), controller="c")  # type: ignore[arg-type]
    answer = asyncio.run(dispatcher.stop_and_wait(REQUEST, 5.0))
    assert [r.step_id for r in answer.settled] == ["a"]
    assert answer.timed_out == ["b"]
