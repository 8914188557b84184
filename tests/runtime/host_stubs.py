"""In-process stand-ins for host actors, Ray's directory of them and the routing table, for the
routing and dispatch tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from choreography_ray.engine.messages import StopResult
from choreography_ray.runtime.host_calls import ControllerHostCalls, WorkerHostCalls

T = TypeVar("T")


class DeadHost(Exception):
    """What a call to a host that died raises (Ray's `RayActorError` in the runtime)."""


class HostStub:
    """A host actor: `stub.method.remote(*args)` records the call and answers like Ray."""

    def __init__(self, name: str, epoch: int = 1) -> None:
        self.name = name
        self.epoch = epoch
        self.hung = False
        self.dead = False
        self.failing: Exception | None = None
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        """Calls answered."""
        self.asked = 0
        """Calls made, answered or not."""

    @property
    def _actor_id(self) -> _ActorId:
        """Which incarnation this is, as a Ray handle's actor id says."""
        return _ActorId(f"{self.name}#{self.epoch}")

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self, method)

    async def answer(self, method: str, args: tuple[Any, ...]) -> Any:
        self.asked += 1
        if self.hung:
            await asyncio.get_running_loop().create_future()  # never answers
        if self.dead:
            raise DeadHost(f"{self.name} died")
        if self.failing is not None:
            raise self.failing
        self.calls.append((method, args))
        return {"ping": self.epoch, "start_steps": [], "stop_steps": StopResult()}.get(method)


class _ActorId:
    def __init__(self, text: str) -> None:
        self.text = text

    def hex(self) -> str:
        return self.text


class _Method:
    """`handle.method`, as Ray's actor handle gives it: `.remote(*args)` makes the call."""

    def __init__(self, host: Any, method: str) -> None:
        self.host = host
        self.method = method

    def remote(self, *args: Any) -> Any:
        return self.host.answer(self.method, args)


class TableStub:
    """A routing table without Ray or a directory: the hosts' typed calls (`host_calls`) as
    the runtime makes them, each answered by `answer(name, method, args)`, which a test
    overrides to stand in for the hosts."""

    workers: list[str] = []
    draining: list[str] = []
    controllers: list[str] = []

    @property
    def reachable(self) -> list[str]:
        return sorted({*self.workers, *self.draining})

    def on_gone(self, listener: object) -> None:
        return None

    async def refresh(self) -> None:
        return None

    def worker(self, name: str) -> WorkerHostCalls:
        return WorkerHostCalls(self, name)

    def controller(self, name: str) -> ControllerHostCalls:
        return ControllerHostCalls(self, name)

    async def send(self, name: str, sending: Callable[[Any], Awaitable[T]]) -> T:
        return await sending(_Handle(self, name))

    async def answer(self, name: str, method: str, args: tuple[Any, ...]) -> Any:
        raise NotImplementedError(f"{name} was not expected to be asked {method}")


class _Handle:
    """Host `name`'s actor handle, answered by the table stub."""

    def __init__(self, table: TableStub, name: str) -> None:
        self.table = table
        self.name = name

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self, method)

    def answer(self, method: str, args: tuple[Any, ...]) -> Any:
        return self.table.answer(self.name, method, args)


class DirectoryStub:
    """Ray's named actors: counts every (blocking) look-up and the thread it ran on."""

    def __init__(self, *hosts: HostStub) -> None:
        self.hosts = {host.name: host for host in hosts}
        self.name_lookups = 0
        self.handle_lookups = 0
        self.threads: set[int] = set()
        self.held: threading.Event | None = None
        """When set, a reading takes its list and then waits for the event before answering."""

    def add(self, host: HostStub) -> HostStub:
        self.hosts[host.name] = host
        return host

    def names(self) -> list[str]:
        self.name_lookups += 1
        self.threads.add(threading.get_ident())
        names = sorted(self.hosts)
        if self.held is not None:
            self.held.wait(timeout=30)
        return names

    def handle(self, name: str) -> Any:
        self.handle_lookups += 1
        self.threads.add(threading.get_ident())
        return self.hosts[name]

    def gone(self, error: BaseException) -> bool:
        return isinstance(error, DeadHost)

    def dead(self, error: BaseException) -> bool:
        return isinstance(error, DeadHost)


async def until(condition: Any, turns: int = 2000) -> None:
    """Wait, a loop turn at a time, for work in a thread (a directory look-up) to land."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the condition never held")
