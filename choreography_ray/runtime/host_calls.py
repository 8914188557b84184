"""What one host asks of another, typed per role: one method per message.

`routes.worker(name).stop_steps(request)` and `routes.controller(name).adopt(key, job_id)` are
checked by mypy where they are written — the arguments and the answer — and each method names
the actor method it calls in the code (`handle.stop_steps.remote(request)`), so no message goes
by a method name held in a string. Every call still goes through the routing table
(`Routes.send`): bounded by `host_call_timeout`, a host that is gone leaves the table.

The actor methods and their arguments are those the hosts always had, so a host of the previous
release receives the very calls it did (rolling upgrades): the typing is the caller's, not a
change of what crosses the wire. A test holds each method here to the actor method of the same
name, its parameters and its answer (`tests/runtime/test_host_calls.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from ..engine.messages import (
    PackedReport,
    PackedStart,
    SettledStops,
    StartResult,
    StopRequest,
    StopResult,
)
from ..jobs.state import JobKey
from .operations import Operation
from .wire import send

T = TypeVar("T")


class Sender(Protocol):
    """Where the calls go: the routing table (`Routes.send`)."""

    async def send(self, name: str, sending: Callable[[Any], Awaitable[T]]) -> T:
        """`sending(handle)` for host `name`, bounded, looked after if the host is gone."""
        ...


class HostCalls:
    """What every host answers, whatever its role."""

    def __init__(self, routes: Sender, name: str) -> None:
        self.routes = routes
        self.name = name

    async def ping(self) -> int:
        """The host's epoch: it answers, and which start of it this is (job ownership)."""
        epoch: int = await self.routes.send(self.name, lambda host: host.ping.remote())
        return epoch


class WorkerHostCalls(HostCalls):
    """A worker host (`WorkerHost`), as a controller host or another worker host calls it."""

    async def start_steps(
        self,
        controller: str,
        job_key: JobKey,
        job_id: str,
        job_type: str,
        starts: list[PackedStart],
        points: float | None = None,
    ) -> list[StartResult]:
        """`points` go only when the job has priority points, and only to a host that knows
        them (it has `prioritize`): a host of the previous release takes its starts as it did,
        in turn with the other jobs."""

        def sending(host: Any) -> Any:
            if points is None or not hasattr(host, "prioritize"):
                return host.start_steps.remote(controller, job_key, job_id, job_type, starts)
            return host.start_steps.remote(controller, job_key, job_id, job_type, starts, points)

        results: list[StartResult] = await self.routes.send(self.name, sending)
        return results

    async def prioritize(self, job_key: JobKey, job_id: str, points: float) -> None:
        """A host of the previous release has no priorities: nothing to tell it."""
        await self.routes.send(
            self.name,
            lambda host: (
                host.prioritize.remote(job_key, job_id, points)
                if hasattr(host, "prioritize")
                else _nothing()
            ),
        )

    async def load(self) -> tuple[int, int]:
        load: tuple[int, int] = await self.routes.send(self.name, lambda host: host.load.remote())
        return load

    async def stop_steps(self, request: StopRequest) -> StopResult:
        result: StopResult = await self.routes.send(
            self.name, lambda host: host.stop_steps.remote(request)
        )
        return result

    async def held_steps(self, job_key: JobKey, job_id: str) -> list[str]:
        held: list[str] = await self.routes.send(
            self.name, lambda host: host.held_steps.remote(job_key, job_id)
        )
        return held

    async def give_up_queued(self, job_key: JobKey, job_id: str, share: float) -> list[str]:
        given: list[str] = await self.routes.send(
            self.name, lambda host: host.give_up_queued.remote(job_key, job_id, share)
        )
        return given

    async def drain(self, deadline: float) -> float:
        delay: float = await self.routes.send(self.name, lambda host: host.drain.remote(deadline))
        return delay

    async def retire(self) -> bool:
        retired: bool = await self.routes.send(self.name, lambda host: host.retire.remote())
        return retired

    async def running_steps(
        self, job_key: JobKey, job_id: str, step_ids: list[str]
    ) -> tuple[str, list[str]]:
        answer: tuple[str, list[str]] = await self.routes.send(
            self.name, lambda host: host.running_steps.remote(job_key, job_id, step_ids)
        )
        return answer

    async def stop_and_wait(self, request: StopRequest, within: float) -> SettledStops:
        settled: SettledStops = await self.routes.send(
            self.name, lambda host: host.stop_and_wait.remote(request, within)
        )
        return settled


class ControllerHostCalls(HostCalls):
    """A controller host (`ControllerHost`), as another host calls it."""

    async def ask(self, operation: Operation[T]) -> T:
        """Have the host perform a client's request (`operations`; `wire.send` speaks the
        previous release's call to a host of that release)."""
        answer: T = await self.routes.send(self.name, lambda host: send(host, operation))
        return answer

    async def deliver(self, key: JobKey, job_id: str, packed: list[PackedReport]) -> None:
        """Step outcomes, already durable, for the job's owner. Still its own actor method,
        not a `Deliver` request to `perform`: a controller host of the previous release has
        only this one."""
        await self.routes.send(self.name, lambda host: host.deliver.remote(key, job_id, packed))

    async def adopt(self, key: JobKey, job_id: str) -> None:
        await self.routes.send(self.name, lambda host: host.adopt.remote(key, job_id))

    async def outstanding_steps(self) -> int:
        count: int = await self.routes.send(self.name, lambda host: host.outstanding_steps.remote())
        return count


async def _nothing() -> None:
    """The answer of a call a host of the previous release has no method for."""
