"""Calls to the cluster's storage actor are bounded like calls between hosts."""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.engine.clock import FakeClock, settle
from choreography_ray.jobs.errors import StorageUnavailableError
from choreography_ray.jobs.state import JobKey
from choreography_ray.recovery.liveness import Bound
from choreography_ray.runtime.remote_storage import RemoteMemoryStorage, _Forward

from .host_stubs import HostStub, until


def test_a_storage_actor_that_never_answers_is_unavailable_after_the_bound(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        actor = HostStub("storage")
        jobs = _Forward(actor, JobKey(), "jobs", Bound(4.0, clock))
        assert await jobs.count() is None  # answered: no bound reached
        actor.hung = True
        call = asyncio.get_running_loop().create_task(jobs.find("job"))
        await settle()
        await clock.advance(3.9)  # the bound is checked a quarter of it apart: 1, 2, 3, 4 s
        assert not call.done()
        await clock.advance(0.1)
        with pytest.raises(StorageUnavailableError, match=r"jobs\.find within 4s"):
            await call

    run(scenario())


def test_a_forwarding_call_is_made_once_per_method() -> None:
    jobs = _Forward(HostStub("storage"), JobKey(), "jobs", Bound(4.0, FakeClock()))
    assert jobs.find is jobs.find and "find" in vars(jobs)


def test_importing_job_modules_into_the_storage_actor_is_bounded(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        provider = object.__new__(RemoteMemoryStorage)  # no Ray: only the actor call matters
        provider.actor = HostStub("storage")
        provider.actor.hung = True
        provider.import_bound = Bound(24.0, clock)
        call = asyncio.get_running_loop().create_task(provider.import_modules(["jobs_module"]))
        await settle()
        await clock.advance(24)
        await until(call.done)
        with pytest.raises(StorageUnavailableError, match="import job modules within 24s"):
            await call

    run(scenario())
