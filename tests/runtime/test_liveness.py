"""Whether a job's owner still runs: this host answers for itself, another host must answer a
bounded ping with the epoch the job recorded."""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.engine.clock import FakeClock, settle
from choreography_ray.jobs.state import JobOwner
from choreography_ray.recovery.liveness import Bound, HostGone, owner_alive

ME = JobOwner(host="controller:a", activation_epoch=1)


async def silent(host: str) -> int:
    await asyncio.get_running_loop().create_future()
    return 0


def test_this_host_owns_a_job_only_in_its_own_activation(run) -> None:
    async def never(host: str) -> int:
        raise AssertionError("this host is not pinged")

    assert run(owner_alive(ME, ME, never))
    assert not run(owner_alive(JobOwner(host=ME.host, activation_epoch=0), ME, never))


def test_another_host_owns_a_job_while_it_answers_with_the_recorded_epoch(run) -> None:
    async def epoch_two(host: str) -> int:
        return 2

    async def gone(host: str) -> int:
        raise HostGone(host, "no such host is running")

    other = JobOwner(host="controller:b", activation_epoch=2)
    assert run(owner_alive(other, ME, epoch_two))
    replaced = JobOwner(host="controller:b", activation_epoch=1)
    assert not run(owner_alive(replaced, ME, epoch_two))
    assert not run(owner_alive(other, ME, gone))


def test_a_ping_that_is_never_answered_means_the_owner_is_gone(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        bound = Bound(3.0, clock)

        async def bounded(host: str) -> int:
            return await bound(silent(host), host)

        asking = asyncio.get_running_loop().create_task(
            owner_alive(JobOwner(host="controller:b", activation_epoch=2), ME, bounded)
        )
        await settle()
        await clock.advance(2.9)
        assert not asking.done()
        await clock.advance(0.1)
        assert asking.done() and asking.result() is False

    run(scenario())


def test_a_bound_gives_up_between_one_and_one_and_a_quarter_bounds(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        bound = Bound(4.0, clock)
        first = asyncio.get_running_loop().create_task(bound(silent("a"), "a"))
        await settle()
        await clock.advance(0.5)
        later = asyncio.get_running_loop().create_task(bound(silent("b"), "b"))
        await settle()
        await clock.advance(3.5)  # 4 s after the first call, 3.5 s after the later one
        assert first.done() and not later.done()
        with pytest.raises(HostGone, match="host a is gone: no answer within 4s"):
            await first
        await clock.advance(1.0)  # checked at 5 s: the later call is 4.5 s old
        with pytest.raises(HostGone, match="host b"):
            await later

    run(scenario())


def test_a_bound_gives_the_answer_and_its_timer_ends_when_nothing_waits(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        bound = Bound(3.0, clock)

        async def answer() -> int:
            return 5

        assert await bound(answer(), "h") == 5
        await settle()
        await clock.advance(0.75)
        assert clock.sleepers == 0

    run(scenario())


def test_a_caller_cancelled_while_waiting_is_cancelled_not_gone(run) -> None:
    async def scenario() -> None:
        bound = Bound(3.0, FakeClock())
        call = asyncio.get_running_loop().create_task(bound(silent("h"), "h"))
        await settle()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    run(scenario())
