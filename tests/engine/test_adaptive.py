"""Adaptive concurrency (AIMD), in process: a fake service that throttles above N calls at once;
the job's window halves on throttled outcomes and grows by one per window of successes, and
settles about N. A job whose steps do not adapt keeps its window and pays nothing."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from choreography_ray.engine.adaptive import AdaptiveWindow
from choreography_ray.engine.messages import StepReport
from choreography_ray.jobs import (
    Job,
    JobsOptions,
    JobStatus,
    JobStep,
    RetryPolicy,
    StepContext,
    StepFailed,
    TypeRegistryError,
)
from choreography_ray.jobs.adaptive import AdaptiveConcurrency
from choreography_ray.jobs.state import StepError
from choreography_ray.jobs.status import JobStepStatus
from choreography_ray.testing import InProcessCluster

CAPACITY = 8
"""Calls the fake service takes at once; one more is throttled."""


class Service:
    in_flight = 0
    calls = 0
    throttled = 0


class Call(BaseModel):
    n: int


class CallService(JobStep[Call, Call, int], name="scenario.adaptive-call"):
    adaptive = AdaptiveConcurrency(limit=32, floor=1)
    retry_policy = RetryPolicy(
        initial_interval=timedelta(milliseconds=10), backoff_coefficient=1.0, maximum_attempts=100
    )
    throttle: ClassVar[bool] = True

    def initialize_state(self, request: Call) -> Call:
        return request

    async def perform(self, state: Call, ctx: StepContext) -> int:
        Service.calls += 1
        Service.in_flight += 1
        try:
            if Service.in_flight > CAPACITY:
                Service.throttled += 1
                raise StepFailed("slow down", throttled=True)
            for _ in range(5):  # the call takes a while: others begin meanwhile
                await asyncio.sleep(0)
            return state.n
        finally:
            Service.in_flight -= 1


class Calls(BaseModel):
    count: int


class CallsJob(Job[Calls], name="scenario.adaptive-calls"):
    keep_after_completed = True

    def prepare_steps(self, request: Calls) -> list[Any]:
        return [self.create_step(CallService, Call(n=n)) for n in range(request.count)]


@pytest.fixture
def service() -> Any:
    Service.in_flight = Service.calls = Service.throttled = 0
    yield Service


def _run_calls(run: Any, count: int) -> Any:
    cluster = InProcessCluster(options=JobsOptions(max_parallel_steps=64), max_parallel_steps=64)

    async def scenario():
        async with cluster:
            result = await cluster.start(CallsJob, Calls(count=count))
            for _ in range(200):
                state = await cluster.manager().get(result.job_id)
                if state.is_finished:
                    return state
                await cluster.advance(0.05)
            raise AssertionError("the job did not finish")

    return run(scenario())


def test_the_window_settles_about_what_the_service_takes(run, service):
    state = _run_calls(run, 400)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 400
    window = state.adaptive_window
    assert window is not None and window.limit == 32
    assert CAPACITY // 2 <= window.window <= CAPACITY + 2  # the AIMD sawtooth about 8
    assert window.throttled == service.throttled > 0
    # Throttling is a small share of the calls once the window found its level.
    assert service.throttled < 0.25 * service.calls
    assert window.text().startswith(f"window {window.window}/32, throttled ")


def _report(status: JobStepStatus, throttled: bool = False) -> StepReport:
    error = StepError(messages=["x"], throttled=throttled) if throttled else None
    return StepReport(step_id="s", status=status, generation=1, attempt=1, stage=0, error=error)


T0 = datetime(2026, 1, 1)


def test_a_throttled_outcome_halves_once_per_window_and_successes_grow_it_by_one():
    window = AdaptiveWindow(AdaptiveConcurrency(limit=16, floor=3), None)
    throttled = _report(JobStepStatus.COMPLETED_WITH_FAILURE, throttled=True)
    window.observe(throttled, T0, T0 + timedelta(seconds=1))
    assert window.window == 8
    window.observe(throttled, T0, T0 + timedelta(seconds=1))  # sent before the halving
    assert window.window == 8 and window.throttled == 2
    for _ in range(8):
        window.observe(_report(JobStepStatus.COMPLETED_SUCCESSFULLY), T0, T0)
    assert window.window == 9
    later = T0 + timedelta(seconds=2)
    for _ in range(5):  # each sent after the halving before it: halves, down to the floor
        window.observe(throttled, later, later)
        later += timedelta(seconds=1)
    assert window.window == 3
    for _ in range(1000):
        window.observe(_report(JobStepStatus.COMPLETED_SUCCESSFULLY), T0, T0)
    assert window.window == 16  # never above the limit


def test_a_named_error_type_or_a_slow_outcome_counts_as_throttled():
    policy = AdaptiveConcurrency(limit=8, latency=2.0, throttle_errors=(TimeoutError,))
    window = AdaptiveWindow(policy, None)
    timeout = StepReport(
        step_id="s",
        status=JobStepStatus.COMPLETED_WITH_FAILURE,
        generation=1,
        attempt=1,
        stage=0,
        error=StepError(messages=["t"], error_type="TimeoutError"),
    )
    window.observe(timeout, T0, T0)
    assert window.window == 4
    slow = T0 + timedelta(seconds=10)
    window.observe(_report(JobStepStatus.COMPLETED_SUCCESSFULLY), slow, slow + timedelta(seconds=3))
    assert window.window == 2 and window.throttled == 2
    other = _report(JobStepStatus.COMPLETED_WITH_FAILURE)  # a failure that is not throttling
    window.observe(other, slow, slow)
    assert window.window == 2 and window.throttled == 2


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 4, "floor": 5}, "above its limit"),
        ({"limit": 4, "latency": -1}, "latency"),
        ({"limit": True}, "limit"),
    ],
)
def test_a_wrong_policy_is_refused(arguments, message):
    with pytest.raises(TypeRegistryError, match=message):
        AdaptiveConcurrency(**arguments)


# -- a window per adaptive step class -------------------------------------------------------------

FIXED = 12
"""The mixed jobs' fixed window: what their steps that do not adapt may run at once."""
LATE = 60
"""Calls from this one on come once the partner's window has shrunk."""


class Mixed:
    """What each class of steps saw: calls at once, their peak, throttled calls."""

    in_flight: ClassVar[dict[str, int]] = {}
    peak: ClassVar[dict[str, int]] = {}
    throttled: ClassVar[dict[str, int]] = {}
    capacity: ClassVar[dict[str, int]] = {}
    release: ClassVar[asyncio.Event | None] = None
    """While set to an unset event, local steps wait for it (the job stays unfinished)."""

    @classmethod
    def reset(cls, **capacity: int) -> None:
        cls.in_flight, cls.peak, cls.throttled = {}, {}, {}
        cls.capacity = capacity
        cls.release = None

    @classmethod
    async def call(cls, name: str, n: int, turns: int = 5) -> None:
        now = cls.in_flight[name] = cls.in_flight.get(name, 0) + 1
        cls.peak[name] = max(cls.peak.get(name, 0), now)
        if n >= LATE:  # the partner's window has found its level by then
            cls.peak[f"{name} late"] = max(cls.peak.get(f"{name} late", 0), now)
        try:
            if now > cls.capacity.get(name, 10**6):
                cls.throttled[name] = cls.throttled.get(name, 0) + 1
                raise StepFailed("slow down", throttled=True)
            for _ in range(turns):  # the call takes a while: others begin meanwhile
                await asyncio.sleep(0)
            if name == "local" and cls.release is not None:
                await cls.release.wait()
        finally:
            cls.in_flight[name] -= 1


_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=10), backoff_coefficient=1.0, maximum_attempts=200
)


class PartnerApi(JobStep[Call, Call, int], name="scenario.adaptive-partner-api"):
    adaptive = AdaptiveConcurrency(limit=32)
    retry_policy = _RETRY

    def initialize_state(self, request: Call) -> Call:
        return request

    async def perform(self, state: Call, ctx: StepContext) -> int:
        await Mixed.call("partner", state.n)
        return state.n


class OtherApi(PartnerApi, name="scenario.adaptive-other-api"):
    adaptive = AdaptiveConcurrency(limit=16, floor=2)

    async def perform(self, state: Call, ctx: StepContext) -> int:
        await Mixed.call("other", state.n)
        return state.n


class LocalWork(PartnerApi, name="scenario.adaptive-local"):
    adaptive = None

    async def perform(self, state: Call, ctx: StepContext) -> int:
        await Mixed.call("local", state.n, turns=20)
        return state.n


class MixedJob(Job[Calls], name="scenario.adaptive-mixed"):
    """Partner calls interleaved with `classes`' steps; the partner's class comes first (the
    one window of earlier versions was the first step type's)."""

    keep_after_completed = True
    max_active_steps = FIXED
    classes: ClassVar[tuple[type[JobStep[Any, Any, Any]], ...]] = (LocalWork,)

    def prepare_steps(self, request: Calls) -> list[Any]:
        steps = []
        for n in range(request.count):
            steps.append(self.create_step(PartnerApi, Call(n=n)))
            steps.extend(self.create_step(step, Call(n=n)) for step in self.classes)
        return steps


class TwoApisJob(MixedJob, name="scenario.adaptive-two-apis"):
    classes = (OtherApi,)


async def _finish(cluster: InProcessCluster, job_id: str) -> Any:
    for _ in range(400):
        state = await cluster.manager().get(job_id)
        if state.is_finished:
            return state
        await cluster.advance(0.05)
    raise AssertionError("the job did not finish")


def _run_mixed(run: Any, job: type[MixedJob], count: int) -> Any:
    async def scenario():
        async with InProcessCluster(max_parallel_steps=128) as cluster:
            return await _finish(cluster, (await cluster.start(job, Calls(count=count))).job_id)

    return run(scenario())


def test_a_throttled_class_does_not_shrink_the_steps_that_do_not_adapt(run):
    Mixed.reset(partner=2)
    state = _run_mixed(run, MixedJob, 120)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 240
    # The local steps ran at the job's full fixed window, beside a partner window of ~2
    # (with one window for the job they run at the partner's).
    assert Mixed.peak["local late"] == FIXED
    assert Mixed.peak["partner late"] <= 4
    partner = state.adaptive_windows[PartnerApi.name]
    # Far below its limit of 32 once the partner throttled; where it ends within its AIMD
    # band (4 or 5 of late) depends on how many successes followed the last throttle.
    assert partner.window < partner.limit // 4
    assert partner.throttled == Mixed.throttled["partner"] > 0
    assert set(state.adaptive_windows) == {PartnerApi.name}


def test_two_adaptive_classes_keep_independent_windows(run):
    Mixed.reset(partner=2)  # the other API never throttles
    state = _run_mixed(run, TwoApisJob, 120)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    windows = state.adaptive_windows
    partner, other = windows[PartnerApi.name], windows[OtherApi.name]
    assert Mixed.peak["other late"] == 16  # its own limit, not the partner's window nor FIXED
    assert (other.window, other.limit, other.throttled) == (16, 16, 0)
    assert partner.window < partner.limit // 4 and partner.throttled > 0  # as above
    assert state.adaptive_window == partner  # what hosts of earlier versions read


def test_a_record_of_the_single_window_shape_loads():
    """A record an earlier version wrote has `adaptive_window` and no `adaptive_windows`."""
    from choreography_ray.jobs.adaptive import window_lines, windows
    from choreography_ray.jobs.state import JobState

    old = JobState.model_validate_json(
        '{"id": "j", "type": "t", "created": "2026-01-01T00:00:00Z",'
        ' "adaptive_window": {"window": 3, "limit": 32, "throttled": 5}}'
    )
    assert old.adaptive_windows == {}
    assert windows(old)[""].window == 3
    assert window_lines(old) == ["adaptive: window 3/32, throttled 5 times"]


@pytest.mark.parametrize("old_shape", [False, True], ids=["windows", "old single window"])
def test_a_recovered_job_goes_on_from_its_stored_windows(run, old_shape):
    """Every partner call is throttled: its window falls to 1; the host is lost while local
    steps block. Recovered, the partner's window starts at 1 again, not at its limit, and its
    throttled count goes on (also from a record of the old single-window shape)."""
    Mixed.reset(partner=0)
    Mixed.release = asyncio.Event()

    async def scenario():
        cluster = InProcessCluster(max_parallel_steps=128)
        async with cluster:
            job_id = (await cluster.start(MixedJob, Calls(count=40))).job_id
            for _ in range(10):
                await cluster.advance(0.05)
            await cluster.crash()
            jobs = cluster.storage().jobs
            before = await jobs.get(job_id)
            if old_shape:  # as an earlier version wrote it
                before.adaptive_window = before.adaptive_windows[PartnerApi.name]
                before.adaptive_windows = {}
                await jobs.save(before)
            Mixed.capacity["partner"] = 10**6
            Mixed.peak = {}
            assert Mixed.release is not None
            Mixed.release.set()
            await (await cluster.manager().rehydrate())
            return before, await _finish(cluster, job_id)

    before, after = run(scenario())
    stored = before.adaptive_window if old_shape else before.adaptive_windows[PartnerApi.name]
    assert stored is not None and stored.window == 1 and stored.throttled > 0
    assert after.status == JobStatus.COMPLETED_SUCCESSFULLY
    # From a window of 1, growing by one per window of successes: 40 calls reach about 8.
    assert Mixed.peak["partner"] <= 10
    assert after.adaptive_windows[PartnerApi.name].throttled == stored.throttled


def test_steps_held_by_a_full_class_are_stopped_with_the_job_and_run_on_resume(run):
    """Partner calls throttle at first: most wait held behind its window of 1 when the job is
    stopped. The stop reaches them too, and a resume runs every step, counted once."""
    Mixed.reset(partner=0)
    Mixed.release = asyncio.Event()

    async def scenario():
        async with InProcessCluster(max_parallel_steps=128) as cluster:
            job_id = (await cluster.start(MixedJob, Calls(count=40))).job_id
            for _ in range(5):
                await cluster.advance(0.05)
            await cluster.manager().stop(job_id)
            await cluster.advance(1)
            stopped = await cluster.manager().get(job_id)
            Mixed.capacity["partner"] = 10**6
            assert Mixed.release is not None
            Mixed.release.set()
            await cluster.manager().resume(job_id)
            return stopped, await _finish(cluster, job_id)

    stopped, finished = run(scenario())
    assert stopped.status == JobStatus.STOPPED and stopped.stop_finalized
    assert finished.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert finished.progress.successful_steps == 80
