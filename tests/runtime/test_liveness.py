"""Whether a job's owner still runs: this host answers for itself, another host must answer a
bounded ping with the epoch the job recorded."""

from __future__ import annotations

import asyncio

from choreography_ray.engine.clock import FakeClock, settle
from choreography_ray.jobs.state import JobOwner
from choreography_ray.recovery.liveness import HostGone, owner_alive, within

ME = JobOwner(host="controller:a", activation_epoch=1)


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

        async def silent(host: str) -> int:
            await asyncio.get_running_loop().create_future()
            return 0

        async def bounded(host: str) -> int:
            return await within(silent(host), 3.0, clock, host)

        asking = asyncio.get_running_loop().create_task(
            owner_alive(JobOwner(host="controller:b", activation_epoch=2), ME, bounded)
        )
        await settle()
        await clock.advance(2.9)
        assert not asking.done()
        await clock.advance(0.1)
        assert asking.done() and asking.result() is False

    run(scenario())


def test_within_gives_the_answer_and_leaves_no_timer_behind(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()

        async def answer() -> int:
            return 5

        assert await within(answer(), 3.0, clock, "h") == 5
        await settle()
        assert clock.sleepers == 0

    run(scenario())
