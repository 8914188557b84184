"""Calls to the cluster's storage actor are bounded like calls between hosts."""

from __future__ import annotations

import asyncio
from typing import Any

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


class _LocalActor:
    """The storage actor, called in this process: `actor.call.remote(...)` runs its `call`."""

    def __init__(self) -> None:
        from choreography_ray.runtime.remote_storage import StorageActor

        self.actor = StorageActor("memory://", [])
        self.call = self
        self.sent: list[tuple[Any, ...]] = []

    def remote(self, *args: Any) -> Any:
        self.sent.append(args)
        return self.actor.call(*args)


def test_keyword_arguments_reach_the_storage_actor(run) -> None:
    """`count_by_status(job_id, verify=False)` (the console's, over `memory://` on a cluster)
    once failed as an unexpected keyword: the forwarding carried positional arguments only."""

    async def scenario() -> None:
        actor = _LocalActor()
        steps = _Forward(actor, JobKey(), "steps", Bound(4.0, FakeClock()))
        counts = await steps.count_by_status("job", verify=False)
        assert dict(counts) == {} and counts.unreadable == 0
        assert actor.sent[-1][4] == {"verify": False}
        await steps.count_for_job("job")
        assert len(actor.sent[-1]) == 4  # no keywords: the previous release's four arguments

    run(scenario())


def test_only_what_the_storage_protocols_declare_is_forwarded(run) -> None:
    jobs = _Forward(_LocalActor(), JobKey(), "jobs", Bound(4.0, FakeClock()))
    assert not hasattr(jobs, "drop_everything")  # as on any store, not a call to the actor
    assert not hasattr(jobs, "count_by_status")  # a steps method is no jobs method

    async def scenario() -> None:
        from choreography_ray.jobs.errors import InvalidOperationError

        actor = _LocalActor().actor
        with pytest.raises(InvalidOperationError, match=r"storage has no operation jobs\.provider"):
            await actor.call(JobKey(), "jobs", "provider", ())
        with pytest.raises(InvalidOperationError, match=r"no operation engine\.save"):
            await actor.call(JobKey(), "engine", "save", ())

    run(scenario())
