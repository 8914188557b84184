"""What the console asks of the cluster: job actions and a picture of its nodes and hosts.

Both are small ports, so the console runs (and is tested) against storage alone, against an
in-process cluster, or against Ray (`console.ray_cluster`): the app never imports Ray.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..jobs.state import JobKey

ACTIONS = ("stop", "drain", "resume", "retry-failed", "remove")
"""Every action the console offers, in the order its buttons show."""


class JobActions(Protocol):
    """Stop, drain, resume, retry the failed steps of and remove a job; each answers a short
    line on success."""

    @property
    def can_drain(self) -> bool:
        """Whether `drain` is there: a stop that lets running steps finish."""
        ...

    async def run(self, action: str, key: JobKey, job_id: str) -> str: ...


@dataclass(frozen=True)
class HostView:
    name: str
    role: str
    """"controller" or "worker"."""
    active_runs: int | None = None
    """Live step activations (worker hosts), when the host answered."""
    max_parallel_steps: int | None = None
    live_jobs: int | None = None
    """Live job activations (controller hosts), when the host answered."""
    problem: str = ""
    """Why the host's figures are missing (it did not answer in time, say)."""
    steps_per_second: float | None = None
    """Runs a worker host finished per second since the console last asked it."""
    logs_url: str = ""
    """The host actor's page (with its logs) in Ray's dashboard, when that is reachable."""


@dataclass(frozen=True)
class NodeView:
    node_id: str
    address: str
    hostname: str
    alive: bool
    controller: bool
    worker: bool
    cpus: float
    hosts: list[HostView] = field(default_factory=list)
    memory_bytes: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    """The node's Ray labels (`ray.io/node-id` and the like left out)."""
    logs_url: str = ""
    """The node's page (with its logs) in Ray's dashboard, when that is reachable."""


@dataclass(frozen=True)
class ClusterSnapshot:
    nodes: list[NodeView]
    modules: list[str]
    """Job modules every host imports."""
    job_types: list[str]
    """Job types those modules register."""
    namespace: str


class StepRates:
    """Each host's step rate, from the count of runs it finished at two askings."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def rate(self, host: str, at: float, done: int) -> float | None:
        """Runs per second since `host` was last asked (None the first time, or after the
        host restarted and its count went back)."""
        before = self._last.get(host)
        self._last[host] = (at, done)
        if before is None or at <= before[0] or done < before[1]:
            return None
        return (done - before[1]) / (at - before[0])


class ClusterView(Protocol):
    async def snapshot(self) -> ClusterSnapshot: ...


def _message(action: str, answer: Any) -> str:
    name = getattr(answer, "name", None)
    if isinstance(answer, tuple):  # retry-failed: the steps run again
        return f"{action}: {len(answer)} step(s)"
    return f"{action}: {name}" if isinstance(name, str) else f"{action}: requested"


class ManagerActions:
    """Actions on an engine's managers, in this event loop: an `InProcessCluster` or anything
    with `manager(key)` (tests, and users trying the console on their own jobs)."""

    can_drain = False

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    async def run(self, action: str, key: JobKey, job_id: str) -> str:
        manager = self.cluster.manager(key)
        calls: dict[str, Callable[[str], Awaitable[object]]] = {
            "stop": manager.stop,
            "resume": manager.resume,
            "retry-failed": lambda job: _retry_failed(manager, job),
            "remove": manager.remove,
        }
        if self.can_drain:
            calls["drain"] = manager.drain
        return _message(action, await _chosen(calls, action)(job_id))


class ClientActions:
    """Actions through a `Jobs` client, awaited on its async core (`jobs.aio`). Drain is
    offered only when the client has it."""

    def __init__(self, jobs: Any) -> None:
        self.jobs = jobs

    @property
    def can_drain(self) -> bool:
        return callable(getattr(self.jobs.aio, "drain", None))

    async def run(self, action: str, key: JobKey, job_id: str) -> str:
        client = self.jobs.aio
        where = {"scope": key.scope, "namespace": key.namespace}
        calls: dict[str, Callable[[str], Awaitable[object]]] = {
            "stop": lambda job: client.stop(job, **where),
            "resume": lambda job: client.resume(job, **where),
            "retry-failed": lambda job: client.retry_failed(job, **where),
            "remove": lambda job: client.remove(job, **where),
        }
        if self.can_drain:
            calls["drain"] = lambda job: client.drain(job, **where)
        return _message(action, await _chosen(calls, action)(job_id))


async def _retry_failed(manager: Any, job_id: str) -> tuple[str, ...]:
    result: tuple[str, ...] = await (await manager.activate(job_id)).retry_failed(None)
    return result


def _chosen(
    calls: dict[str, Callable[[str], Awaitable[object]]], action: str
) -> Callable[[str], Awaitable[object]]:
    """The call a form's action names: one of a closed table, or a refusal."""
    call = calls.get(action)
    if call is None:
        raise ValueError(f"unknown action {action!r}")
    return call
