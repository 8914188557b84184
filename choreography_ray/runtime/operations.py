"""What a client asks of a controller host: one typed request per verb.

A request is a frozen dataclass that names its partition and carries its arguments; its type
parameter is what it answers, and `run` says what it asks of the partition's jobs manager. The
client sends the request object itself (`wire.send`), the controller host performs it
(`ControllerHost.perform`), and a host that finds the job owned by another sends the same object
on. No hop matches a method name: mypy checks a request's arguments where it is built and its
answer where it is read, and a host refuses anything that is not a request
(`InvalidOperationError`).

A host of the previous release has no `perform`: `wire.send` speaks that release's calls to it
(`previous_release`), so the two releases work together during a rolling upgrade.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from ..engine.job import JobStartResult
from ..engine.manager import JobsManager
from ..engine.messages import PackedReport, unpack_reports
from ..engine.results import ItemPage
from ..jobs.errors import DrainOutcome, InvalidOperationError, ResumeJobSuccess
from ..jobs.mapping import MapItems
from ..jobs.registry import Payload, TypeKind
from ..jobs.state import JobKey, JobState
from ..recovery.explicit import RehydrationSummary, rehydrate_within
from ..storage.protocols import JobQuery, StepCounts
from ..storage.step_query import StepQuery

if TYPE_CHECKING:
    from .metrics import Metrics

R = TypeVar("R")
T = TypeVar("T")


class Serving(Protocol):
    """What a request asks of the controller host that performs it (`ControllerHost`)."""

    @property
    def metrics(self) -> Metrics: ...

    def manager(self, key: JobKey) -> JobsManager:
        """The jobs manager of a partition, made when first asked for."""
        ...

    def successor(self) -> str | None:
        """The controller host that takes this one's new jobs while its node drains."""
        ...

    async def ask(self, host: str, operation: Operation[T]) -> T:
        """Perform `operation` on another controller host."""
        ...


@dataclass(frozen=True)
class Operation(ABC, Generic[R]):
    """A request to a controller host about one partition, answering an `R`."""

    what: ClassVar[str]
    """The call as the user knows it ("jobs.stop"), for one-line errors."""

    key: JobKey

    @abstractmethod
    async def run(self, host: Serving) -> R:
        """Perform the request on `host`. A job another live host owns raises
        `OwnedElsewhereError`: the host then sends the request to the owner."""


@dataclass(frozen=True)
class Start(Operation[JobStartResult]):
    """Start a job. A map job (`jobs.map`) carries its `items` as checked JSON in chunks
    (`MapItems`), from which the host plans a step per item, and its own window."""

    what = "jobs.start"
    job_type: str
    request: Payload
    job_id: str
    items: MapItems | None = None
    max_active_steps: int | None = None

    async def run(self, host: Serving) -> JobStartResult:
        successor = host.successor()
        if successor is not None:  # this node goes: the job starts on a host that stays
            return await host.ask(successor, self)
        manager = host.manager(self.key)
        registry = manager.ctx.registry
        job_class = registry.resolve(self.job_type, TypeKind.JOB)
        request = registry.load(self.request, TypeKind.REQUEST)
        result = await manager.start(
            job_class,
            request,
            job_id=self.job_id,
            steps=None if self.items is None else self.items.details(registry),
            max_active_steps=self.max_active_steps,
        )
        host.metrics.job_started(self.job_type, result.succeeded)
        return result


@dataclass(frozen=True)
class Get(Operation[JobState]):
    what = "jobs.get"
    job_id: str

    async def run(self, host: Serving) -> JobState:
        return await host.manager(self.key).get(self.job_id)


@dataclass(frozen=True)
class CountSteps(Operation[StepCounts]):
    what = "jobs.step_counts"
    job_id: str

    async def run(self, host: Serving) -> StepCounts:
        return await host.manager(self.key).step_counts(self.job_id)


@dataclass(frozen=True)
class ReadResults(Operation[ItemPage]):
    """A page of the job's steps as item outcomes, read from storage by any controller host
    (storage is the truth; the job's owner is not asked). Results travel as stored JSON."""

    what = "jobs.results"
    job_id: str
    query: StepQuery

    async def run(self, host: Serving) -> ItemPage:
        steps = host.manager(self.key).ctx.storage.steps
        return ItemPage.of(await steps.query(self.job_id, self.query))


@dataclass(frozen=True)
class ListJobs(Operation[list[JobState]]):
    what = "jobs.list"
    query: JobQuery = field(default_factory=JobQuery)

    async def run(self, host: Serving) -> list[JobState]:
        return await host.manager(self.key).list(self.query)


@dataclass(frozen=True)
class Wait(Operation[JobState | None]):
    """The job's state once it is finished (None once cleared), or as it stands after
    `within` seconds: the host holds the call, so a wait ends as the job does."""

    what = "jobs.wait"
    job_id: str
    within: float

    async def run(self, host: Serving) -> JobState | None:
        return await host.manager(self.key).wait_finished(self.job_id, self.within)


@dataclass(frozen=True)
class Stop(Operation[None]):
    what = "jobs.stop"
    job_id: str

    async def run(self, host: Serving) -> None:
        await host.manager(self.key).stop(self.job_id)


@dataclass(frozen=True)
class Drain(Operation[DrainOutcome]):
    what = "jobs.drain"
    job_id: str
    within: float

    async def run(self, host: Serving) -> DrainOutcome:
        return await host.manager(self.key).drain(self.job_id, self.within)


@dataclass(frozen=True)
class Resume(Operation[ResumeJobSuccess]):
    what = "jobs.resume"
    job_id: str

    async def run(self, host: Serving) -> ResumeJobSuccess:
        return await host.manager(self.key).resume(self.job_id)


@dataclass(frozen=True)
class Remove(Operation[None]):
    what = "jobs.remove"
    job_id: str

    async def run(self, host: Serving) -> None:
        await host.manager(self.key).remove(self.job_id)


@dataclass(frozen=True)
class Rehydrate(Operation[RehydrationSummary]):
    what = "jobs.rehydrate"
    within: float

    async def run(self, host: Serving) -> RehydrationSummary:
        manager = host.manager(self.key)
        return await rehydrate_within(manager, self.within, manager.ctx.clock)


@dataclass(frozen=True)
class Deliver(Operation[None]):
    """Step outcomes a worker host reported, already durable, for the job's owner."""

    what = "deliver"
    job_id: str
    reports: list[PackedReport]

    async def run(self, host: Serving) -> None:
        await host.manager(self.key).deliver(self.job_id, unpack_reports(self.reports))


def checked(operation: object) -> Operation[Any]:
    """`operation` if it is a request a controller host performs; else a one-line refusal that
    names what came instead (a caller that bypassed the typed client, or another release)."""
    if isinstance(operation, Operation):
        return operation
    shown = repr(operation)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise InvalidOperationError(
        f"a controller host performs the client's operations "
        f"(choreography_ray.runtime.operations), not {type(operation).__qualname__} {shown}"
    )
