"""Recovery that failed is retried alone: after 1 s, doubling to 60 s, until it works or the host
stops; a host start that failed is begun again; an explicit pass answers within its bound.
In-process, on the fake clock."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from choreography_ray.engine.clock import FakeClock, settle
from choreography_ray.jobs.errors import InvalidOptionError
from choreography_ray.recovery.explicit import RehydrationSummary, check_timeout, rehydrate_within
from choreography_ray.recovery.rehydration import RehydrationReport
from choreography_ray.recovery.retries import Partitions, Retries, Startup


async def advance(clock: FakeClock, seconds: float) -> None:
    """Let the chains just begun reach their first sleep, then move the clock."""
    await settle()
    await clock.advance(seconds)


class Flaky:
    """An attempt per key that fails its first `failures[key]` times (forever when -1), and
    records when each attempt was made."""

    def __init__(self, clock: FakeClock, **failures: int) -> None:
        self.clock = clock
        self.failures = failures
        self.attempts: dict[str, list[datetime]] = {}
        self.hang: set[str] = set()

    async def __call__(self, key: str) -> None:
        self.attempts.setdefault(key, []).append(self.clock.now())
        if key in self.hang:
            await asyncio.get_running_loop().create_future()
        left = self.failures.get(key, 0)
        if left != 0:
            self.failures[key] = left - 1
            raise OSError(f"storage unavailable for {key}")

    def offsets(self, key: str, start: datetime) -> list[float]:
        return [(at - start).total_seconds() for at in self.attempts.get(key, [])]


def test_a_failing_attempt_is_retried_after_1_s_doubling_to_60_s(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        start = clock.now()
        flaky = Flaky(clock, a=-1)
        retries: Retries[str] = Retries(flaky, clock, what="rehydrating partition")
        with pytest.raises(OSError, match="storage unavailable for a"):
            await retries.run("a")
        await advance(clock, 400)
        assert flaky.offsets("a", start) == [0, 1, 3, 7, 15, 31, 63, 123, 183, 243, 303, 363]
        assert retries.failing == {"a"}
        retries.close()

    run(scenario())


def test_a_success_stops_the_retries(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        start = clock.now()
        flaky = Flaky(clock, a=3)
        retries: Retries[str] = Retries(flaky, clock, what="rehydrating partition")
        with pytest.raises(OSError):
            await retries.run("a")
        await advance(clock, 1000)
        assert flaky.offsets("a", start) == [0, 1, 3, 7]  # the fourth attempt succeeded
        assert retries.failing == frozenset()
        assert clock.sleepers == 0

    run(scenario())


def test_a_success_of_another_caller_ends_the_retries(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        start = clock.now()
        flaky = Flaky(clock, a=1)
        retries: Retries[str] = Retries(flaky, clock, what="rehydrating partition")
        with pytest.raises(OSError):
            await retries.run("a")
        await retries.run("a")  # a membership-triggered pass, say: it succeeds at once
        await advance(clock, 1000)
        assert flaky.offsets("a", start) == [0, 0]
        assert clock.sleepers == 0

    run(scenario())


def test_a_partition_failing_or_hanging_never_blocks_another(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        start = clock.now()
        flaky = Flaky(clock, a=1, b=2)
        retries: Retries[str] = Retries(flaky, clock, what="rehydrating partition")
        for key in ("a", "b"):
            with pytest.raises(OSError):
                await retries.run(key)
        flaky.hang.add("a")  # a's retry hangs on a store that never answers
        await advance(clock, 10)
        assert flaky.offsets("a", start) == [0, 1]
        assert flaky.offsets("b", start) == [0, 1, 3]  # b went on at its own pace
        assert retries.failing == {"a"}
        flaky.hang.clear()
        await asyncio.wait_for(retries.run("c"), 1)  # a new pass is not held up either
        retries.close()

    run(scenario())


def test_close_stops_every_retry(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        start = clock.now()
        flaky = Flaky(clock, a=-1, b=-1)
        retries: Retries[str] = Retries(flaky, clock, what="rehydrating partition")
        for key in ("a", "b"):
            with pytest.raises(OSError):
                await retries.run(key)
        await advance(clock, 1)
        retries.close()
        await settle()
        assert clock.sleepers == 0  # every chain ended at once
        await advance(clock, 1000)
        assert flaky.offsets("a", start) == [0, 1] and flaky.offsets("b", start) == [0, 1]
        assert clock.sleepers == 0
        with pytest.raises(OSError):
            await retries.run("a")  # the host stops: an attempt still answers, never retried
        await advance(clock, 1000)
        assert flaky.offsets("a", start) == [0, 1, 1001]

    run(scenario())


def test_a_partition_is_known_only_once_its_rehydration_succeeded(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        start = clock.now()
        flaky = Flaky(clock, a=2)
        partitions: Partitions[str] = Partitions(flaky, clock, what="rehydrating partition")
        await partitions.recover(["a", "b"])  # a fails; b is not held up by it
        assert partitions.known == {"b"} and partitions.failing == {"a"}
        await advance(clock, 1)
        assert partitions.known == {"b"}
        await advance(clock, 2)
        assert partitions.known == {"a", "b"} and partitions.failing == frozenset()
        await partitions.recover(["a", "b"])  # known partitions are not rehydrated again
        assert flaky.offsets("a", start) == [0, 1, 3] and flaky.offsets("b", start) == [0]
        partitions.close()

    run(scenario())


def test_a_failed_host_start_is_begun_again_by_the_next_call(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        flaky = Flaky(clock, start=1)
        startup = Startup(lambda: flaky("start"), clock, what="controller host")
        with pytest.raises(OSError):
            await startup.wait()
        await startup.wait()  # not memoized: started again, and now it works
        await startup.wait()
        assert len(flaky.attempts["start"]) == 2
        await advance(clock, 1000)
        assert len(flaky.attempts["start"]) == 2  # a start that worked is never retried
        startup.close()

    run(scenario())


def test_a_failed_host_start_keeps_retrying_with_no_caller(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        start = clock.now()
        flaky = Flaky(clock, start=3)
        startup = Startup(lambda: flaky("start"), clock, what="controller host")
        with pytest.raises(OSError):
            await startup.wait()
        await advance(clock, 100)
        assert flaky.offsets("start", start) == [0, 1, 3, 7]
        await asyncio.wait_for(startup.wait(), 1)  # started by the retries
        assert len(flaky.attempts["start"]) == 4

    run(scenario())


def test_callers_share_a_start_under_way(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        began = 0
        gate = asyncio.Event()

        async def start() -> None:
            nonlocal began
            began += 1
            await gate.wait()

        startup = Startup(start, clock, what="worker host")
        waiting = [asyncio.ensure_future(startup.wait()) for _ in range(3)]
        await settle()
        gate.set()
        await asyncio.gather(*waiting)
        assert began == 1

    run(scenario())


class Manager:
    def __init__(self, drain: asyncio.Future[RehydrationReport]) -> None:
        self.drain = drain

    async def rehydrate(self) -> asyncio.Future[RehydrationReport]:
        return self.drain


def test_an_explicit_pass_answers_with_counts_once_drained(run) -> None:
    async def scenario() -> None:
        drain = asyncio.get_running_loop().create_future()
        drain.set_result(
            RehydrationReport(
                queued=["a", "b", "c"], resumed=["a"], finished_stops=["b"], failed=["c"]
            )
        )
        summary = await rehydrate_within(Manager(drain), 5, FakeClock())
        assert summary == RehydrationSummary(
            drained=True, queued=3, resumed=1, finished_stops=1, skipped=0, failed=1
        )
        assert "3 interrupted, 1 resumed, 1 stops finished" in summary.line()

    run(scenario())


def test_an_explicit_pass_counts_the_quarantined_jobs_it_left_alone(run) -> None:
    async def scenario() -> RehydrationSummary:
        drain = asyncio.get_running_loop().create_future()
        drain.set_result(RehydrationReport(queued=["a", "b"], resumed=["a"], quarantined=["b"]))
        return await rehydrate_within(Manager(drain), 5, FakeClock())

    summary = run(scenario())
    assert summary.quarantined == 1
    assert summary.line().endswith("0 skipped, 0 failed, 1 quarantined")
    assert "quarantined" not in RehydrationSummary(drained=True, queued=1, resumed=1).line()


def test_an_explicit_pass_answers_at_its_bound_while_the_drain_goes_on(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        drain: asyncio.Future[RehydrationReport] = asyncio.get_running_loop().create_future()
        answer = asyncio.ensure_future(rehydrate_within(Manager(drain), 5, clock))
        await settle()
        await advance(clock, 4)
        assert not answer.done()
        await advance(clock, 1)
        assert answer.done()
        assert answer.result() == RehydrationSummary(drained=False)
        assert not drain.cancelled()  # the jobs keep resuming
        assert clock.sleepers == 0

    run(scenario())


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "5", True, None])
def test_a_bad_bound_is_a_one_line_error(bad: object) -> None:
    with pytest.raises(InvalidOptionError, match=r"^timeout: must be a positive number"):
        check_timeout(bad)
    assert check_timeout(2) == 2.0
