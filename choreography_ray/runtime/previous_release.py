"""The previous release's calls, both ways, for the length of a rolling upgrade.

That release's clients and controller hosts call one actor method per verb, with positional
arguments (`get(key, job_id)`, `stop(key, job_id)`, ...); this release sends one typed request
to `perform`. While both run, a host of this release answers the old calls
(`PreviousReleaseCalls`, each building the request it stands for), and a caller of this release
speaks them to a host that has no `perform` (`send_previous`, chosen by the request's type).
Delete this module, and `ControllerHost`'s base of that name, in the release after.
"""

from __future__ import annotations

import builtins
from abc import abstractmethod
from functools import singledispatch
from typing import Any, TypeVar

from ..engine.job import JobStartResult
from ..jobs.errors import DrainOutcome, InvalidOperationError, ResumeJobSuccess
from ..jobs.registry import Payload
from ..jobs.state import JobKey, JobState
from ..recovery.explicit import RehydrationSummary
from ..storage.protocols import JobQuery, StepCounts
from .operations import (
    CountSteps,
    Deliver,
    Drain,
    Get,
    ListJobs,
    Operation,
    Rehydrate,
    Remove,
    Resume,
    Start,
    Stop,
    Wait,
)

T = TypeVar("T")


@singledispatch
def send_previous(operation: Operation[Any], handle: Any) -> Any:
    """`operation` as the previous release's call on `handle`: its answer's reference."""
    raise InvalidOperationError(
        f"{type(operation).__qualname__} is new in this release: a host of the previous "
        "release cannot perform it"
    )


@send_previous.register
def _start(op: Start, handle: Any) -> Any:
    if op.items is not None or op.max_active_steps is not None:
        raise InvalidOperationError(
            "jobs.map is new in this release: a host of the previous release cannot start it"
        )
    return handle.start.remote(op.key, op.job_type, op.request, op.job_id)


@send_previous.register
def _get(op: Get, handle: Any) -> Any:
    return handle.get.remote(op.key, op.job_id)


@send_previous.register
def _count_steps(op: CountSteps, handle: Any) -> Any:
    return handle.step_counts.remote(op.key, op.job_id)


@send_previous.register
def _list(op: ListJobs, handle: Any) -> Any:
    return handle.list.remote(op.key, op.query)


@send_previous.register
def _wait(op: Wait, handle: Any) -> Any:
    return handle.wait.remote(op.key, op.job_id, op.within)


@send_previous.register
def _stop(op: Stop, handle: Any) -> Any:
    return handle.stop.remote(op.key, op.job_id)


@send_previous.register
def _drain(op: Drain, handle: Any) -> Any:
    return handle.drain.remote(op.key, op.job_id, op.within)


@send_previous.register
def _resume(op: Resume, handle: Any) -> Any:
    return handle.resume.remote(op.key, op.job_id)


@send_previous.register
def _remove(op: Remove, handle: Any) -> Any:
    return handle.remove.remote(op.key, op.job_id)


@send_previous.register
def _rehydrate(op: Rehydrate, handle: Any) -> Any:
    return handle.rehydrate.remote(op.key, op.within)


@send_previous.register
def _deliver(op: Deliver, handle: Any) -> Any:
    return handle.deliver.remote(op.key, op.job_id, op.reports)


class PreviousReleaseCalls:
    """A controller host's answers to the previous release's calls: each is the request it
    stands for, performed. (`deliver` is not here: worker hosts of this release call it too.)"""

    @abstractmethod
    async def perform(self, operation: Operation[T]) -> T: ...

    async def start(
        self, key: JobKey, job_type: str, request: Payload, job_id: str
    ) -> JobStartResult:
        return await self.perform(Start(key, job_type, request, job_id))

    async def get(self, key: JobKey, job_id: str) -> JobState:
        return await self.perform(Get(key, job_id))

    async def step_counts(self, key: JobKey, job_id: str) -> StepCounts:
        return await self.perform(CountSteps(key, job_id))

    async def list(self, key: JobKey, query: JobQuery) -> builtins.list[JobState]:
        return await self.perform(ListJobs(key, query))

    async def wait(self, key: JobKey, job_id: str, within: float) -> JobState | None:
        return await self.perform(Wait(key, job_id, within))

    async def stop(self, key: JobKey, job_id: str) -> None:
        await self.perform(Stop(key, job_id))

    async def drain(self, key: JobKey, job_id: str, within: float) -> DrainOutcome:
        return await self.perform(Drain(key, job_id, within))

    async def resume(self, key: JobKey, job_id: str) -> ResumeJobSuccess:
        return await self.perform(Resume(key, job_id))

    async def remove(self, key: JobKey, job_id: str) -> None:
        await self.perform(Remove(key, job_id))

    async def rehydrate(self, key: JobKey, within: float) -> RehydrationSummary:
        return await self.perform(Rehydrate(key, within))


__all__ = ["PreviousReleaseCalls", "send_previous"]
