"""Rate limits per step type, in process under the fake clock: a token bucket in storage that
every worker host draws from; runs wait for a token without taking a slot, never fail for it."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, Field

from choreography_ray.engine.clock import FakeClock
from choreography_ray.engine.rates import take
from choreography_ray.jobs import (
    Job,
    JobKey,
    JobsOptions,
    JobStatus,
    JobStep,
    RateLimit,
    StepContext,
    TypeRegistryError,
)
from choreography_ray.testing import InProcessCluster

from . import fixtures

BEGAN: list[tuple[str, float]] = []
"""(step, second of the fake clock) of every run that began."""
CLOCK = FakeClock()


class Call(BaseModel):
    key: str


class CallApi(JobStep[Call, Call, int], name="scenario.rated-call"):
    rate_limit = "2/s"

    def initialize_state(self, request: Call) -> Call:
        return request

    async def perform(self, state: Call, ctx: StepContext) -> int:
        BEGAN.append((state.key, CLOCK.now().timestamp() - START[0]))
        if fixtures.SCRIPT.behaviour[state.key].block:
            await fixtures.SCRIPT.gate(state.key).wait()
        return 1


START = [CLOCK.now().timestamp()]


class Calls(BaseModel):
    keys: list[str] = Field(default_factory=list)


class CallsJob(Job[Calls], name="scenario.rated-calls"):
    keep_after_completed = True
    step_type: ClassVar[type[JobStep[Any, Any, Any]]] = CallApi

    def prepare_steps(self, request: Calls) -> list[Any]:
        return [self.create_step(self.step_type, Call(key=key)) for key in request.keys]


@pytest.fixture
def began(script: Any) -> Any:
    BEGAN.clear()
    START[0] = CLOCK.now().timestamp()
    yield BEGAN
    BEGAN.clear()


def _cluster(workers: int = 1, slots: int = 8) -> InProcessCluster:
    options = JobsOptions(max_parallel_steps=slots)
    return InProcessCluster(options=options, clock=CLOCK, workers=workers, max_parallel_steps=slots)


def _within_the_limit(began: list[tuple[str, float]], rate: float = 2.0, burst: int = 2) -> bool:
    """Whether the n-th run (from 0) began no sooner than the bucket allows: after `burst` at
    once, one more every 1 / `rate` seconds."""
    times = sorted(second for _, second in began)
    return all(second >= (n - burst + 1) / rate - 1e-9 for n, second in enumerate(times))


def test_runs_of_a_limited_type_begin_at_its_rate_after_a_burst(run, began):
    cluster = _cluster()

    async def scenario():
        async with cluster:
            result = await cluster.start(CallsJob, Calls(keys=[f"c{n}" for n in range(9)]))
            await cluster.settle()
            for _ in range(6):
                await cluster.advance(1)
            return await cluster.wait(result.job_id)

    state = run(scenario())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY  # waited, never failed
    # A burst of 2, then one every half second: no sooner, and no later either.
    assert sorted(second for _, second in began) == [0, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5]


def test_two_worker_hosts_share_one_bucket(run, began):
    cluster = _cluster(workers=2)

    async def scenario():
        async with cluster:
            for job in range(2):
                keys = [f"j{job}-{n}" for n in range(8)]
                await cluster.start(CallsJob, Calls(keys=keys))
            await cluster.settle()
            for _ in range(8):
                await cluster.advance(1)

    run(scenario())
    assert len(began) == 16
    assert {host for host, _ in cluster.sent} == {"worker-0", "worker-1"}
    assert _within_the_limit(began)  # both hosts together, not 2 a second each
    assert max(second for _, second in began) == pytest.approx(7.0)  # and at that rate


def test_a_waiting_run_takes_no_slot_and_other_types_go_on(run, began, script):
    """One slot: the rate-limited runs wait for tokens outside the queue, so the job of
    another type runs at once beside them."""
    cluster = _cluster(slots=1)

    async def scenario():
        async with cluster:
            rated = await cluster.start(CallsJob, Calls(keys=[f"c{n}" for n in range(6)]))
            other = await cluster.start(fixtures.ScenarioJob, fixtures.request("x", "y", "z"))
            await cluster.settle()
            done = await cluster.manager().get(other.job_id)
            for _ in range(4):
                await cluster.advance(1)
            return done, await cluster.wait(rated.job_id)

    other, rated = run(scenario())
    assert other.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert rated.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_a_stopped_job_takes_its_waiting_runs_back_and_counts_them_stopped(run, began):
    cluster = _cluster()

    async def scenario():
        async with cluster:
            result = await cluster.start(CallsJob, Calls(keys=[f"c{n}" for n in range(6)]))
            await cluster.settle()
            await cluster.manager().stop(result.job_id)
            await cluster.settle()
            stopped = await cluster.manager().get(result.job_id)
            await cluster.advance(5)
            return stopped

    stopped = run(scenario())
    assert stopped.status == JobStatus.STOPPED and stopped.stop_finalized
    assert stopped.progress.successful_steps == 2 and stopped.progress.stopped_steps == 4
    assert len(began) == 2  # the held runs never began


def test_a_bucket_fills_at_its_rate_up_to_its_size(run):
    cluster = _cluster()
    limit = RateLimit(10, per=1.0, burst=5)

    async def scenario():
        async with cluster:
            storage = cluster.storage(JobKey())
            answers = [await take(storage, cluster.registry, "t", limit, 8, 100.0)]
            answers.append(await take(storage, cluster.registry, "t", limit, 8, 100.0))
            answers.append(await take(storage, cluster.registry, "t", limit, 8, 100.3))
            answers.append(await take(storage, cluster.registry, "t", limit, 8, 200.0))
            return answers

    (full, empty, refilled, capped) = run(scenario())
    assert full == (5, 0.0)  # the burst
    assert empty[0] == 0 and empty[1] == pytest.approx(0.1)  # a token every 0.1 s
    assert refilled == (3, 0.0)
    assert capped == (5, 0.0)  # a long quiet fills it to its size, no more


@pytest.mark.parametrize(
    ("text", "rate", "bucket"),
    [
        ("100/s", 100.0, 100),
        ("5000/h", 5000 / 3600, 1),
        ("10/min", 10 / 60, 1),
        ("3/d", 3 / 86400, 1),
    ],
)
def test_a_rate_limit_reads_from_text(text, rate, bucket):
    limit = RateLimit.of(text)
    assert limit.rate == pytest.approx(rate) and limit.bucket == bucket


@pytest.mark.parametrize("wrong", ["100", "fast", "10/fortnight", "-1/s", "0/s", 5])
def test_a_wrong_rate_limit_is_refused_when_the_class_is_made(wrong):
    with pytest.raises(TypeRegistryError, match="rate limit"):

        class Wrong(JobStep[Call, Call, int], name=f"scenario.wrong-rate-{wrong!s}"):
            rate_limit = wrong

            def initialize_state(self, request: Call) -> Call:
                return request

            async def perform(self, state: Call, ctx: StepContext) -> int:
                return 1
