"""A host's routing table: which controller and worker hosts exist, and their handles.

Finding host actors asks Ray's control store, a blocking call; made on a host's event loop for
every dispatch, stop and report, it stalled every job of the host meanwhile. The table is read
off the loop — on start, every `ROUTES_REFRESH_SECONDS`, and when a call to a host fails or
names a host the table does not know — and messages read it from memory. A host whose call
failed (it died, or did not answer within `host_call_timeout`) leaves the table at once; one
that timed out comes back only once it answers a ping. The pings run apart from the reading:
a suspect that hangs while still listed must not hold up every `refresh` (and every message
that waits for one) for a whole bound.

Messages are typed per role (`host_calls`): `routes.worker(name).stop_steps(request)`; each
goes through `send`, which the bound and the suspect/dead handling wrap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from ..engine.clock import Clock
from ..recovery.liveness import Bound, HostGone
from .constants import CONTROLLER_PREFIX, ROUTES_REFRESH_SECONDS, WORKER_PREFIX
from .control_calls import control_store_call
from .host_calls import ControllerHostCalls, WorkerHostCalls

T = TypeVar("T")

log = logging.getLogger("choreography_ray.runtime")


def incarnation(handle: Any) -> str | None:
    """Which incarnation of a host a handle reaches: its Ray actor id, as Ray's actor table
    lists it (None for no handle, or a stand-in without one)."""
    actor_id = getattr(handle, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else None


class HostDirectory(Protocol):
    """Blocking look-ups of one namespace's host actors (Ray's named actors); called off the
    event loop only."""

    def names(self) -> list[str]:
        """The names of the host actors that exist now."""
        ...

    def handle(self, name: str) -> Any:
        """The handle of a host actor; `LookupError` (or `ValueError`) when it is gone."""
        ...

    def gone(self, error: BaseException) -> bool:
        """Whether a failed call's error says the host itself died or is unreachable (not
        that the call failed); a call the bound gave up on (`HostGone`) is `Routes`' own."""
        ...

    def dead(self, error: BaseException) -> bool:
        """Whether a failed call's error says the host actor died for good (not merely that
        it could not be reached)."""
        ...


class Routes:
    """The hosts this host talks to, kept fresh off the event loop."""

    def __init__(
        self,
        directory: HostDirectory,
        *,
        timeout: float,
        clock: Clock,
        cadence: float = ROUTES_REFRESH_SECONDS,
    ) -> None:
        self.directory = directory
        self.clock = clock
        self.bound = Bound(timeout, clock)
        self.cadence = cadence
        self._handles: dict[str, Any] = {}
        self._suspects: set[str] = set()
        self._listeners: list[Callable[[str], None]] = []
        self._dead_listeners: list[Callable[[str, str | None], None]] = []
        self._last: dict[str, Any] = {}
        """The handle each host had when it left the table: which incarnation died."""
        self._joined_listeners: list[Callable[[list[str]], None]] = []
        self._announced: set[str] = set()
        """Hosts whose death was told, until a reading lists the name again (a new one)."""
        self._refreshing: asyncio.Task[None] | None = None
        self._pinging: dict[str, Any] = {}
        """The handle being pinged, per suspect: a replacement listed meanwhile is pinged too."""
        self._pings: set[asyncio.Task[None]] = set()
        self._keeper: asyncio.Task[None] | None = None
        self._draining: set[str] = set()
        """Hosts on nodes Ray drains: still called, never given new work."""
        self.workers: list[str] = []
        """Live worker hosts that take new work (not draining), sorted; replaced (never
        changed in place) when the table changes."""
        self.controllers: list[str] = []
        """Live controller hosts, sorted."""

    def on_gone(self, listener: Callable[[str], None]) -> None:
        """Call `listener(name)` whenever a host leaves the table (where re-dispatch hooks in)."""
        self._listeners.append(listener)

    def on_dead(self, listener: Callable[[str, str | None], None]) -> None:
        """Call `listener(name, incarnation)` once a host is known dead (the incarnation: the
        Ray actor id of the handle that died, None when not known): Ray said so on a call, or
        a reading no longer lists it. A host that only did not answer in time is not dead: it
        stays a suspect until it answers again or vanishes."""
        self._dead_listeners.append(listener)

    @property
    def draining(self) -> list[str]:
        """Hosts of the table whose node Ray drains (not in `workers`), sorted."""
        return sorted(self._draining)

    @property
    def reachable(self) -> list[str]:
        """Worker hosts that hold runs and are called about them, sorted: those that take new
        work and those whose node drains. A draining host takes no new step, but its runs
        are still told of stops, located, waited for and handed back."""
        return sorted({*self.workers, *self._draining})

    def drain(self, names: Iterable[str]) -> None:
        """Hosts whose node Ray drains: they leave `workers` (no new step goes there) but stay
        callable (their runs are stopped and moved, their queued runs handed back)."""
        self._draining.update(names)
        self._changed([])

    def on_joined(self, listener: Callable[[list[str]], None]) -> None:
        """Call `listener(names)` when a reading finds hosts the table did not have (a node
        that joined, a host started again): where joined workers get their first work."""
        self._joined_listeners.append(listener)

    async def start(self) -> None:
        """Read the table once, then keep it fresh at the cadence until `close`."""
        if self._keeper is None:
            await self.refresh()
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
        for ping in self._pings:
            ping.cancel()

    def worker(self, name: str) -> WorkerHostCalls:
        """Worker host `name`, called through this table: one typed method per message."""
        return WorkerHostCalls(self, name)

    def controller(self, name: str) -> ControllerHostCalls:
        """Controller host `name`, called through this table: one typed method per message."""
        return ControllerHostCalls(self, name)

    async def send(self, name: str, sending: Callable[[Any], Awaitable[T]]) -> T:
        """`sending(handle)` for host `name` (the typed calls of `host_calls` name the actor
        method), bounded by the timeout; a host that is gone leaves the table (and the table
        is read again) before the error is raised."""
        handle = self._handles.get(name)
        if handle is None:
            handle = await self._find(name)
        try:
            answer: T = await self.bound(sending(handle), name)
            return answer
        except Exception as error:
            if isinstance(error, HostGone) or self.directory.gone(error):
                self.forget(name)
                if self.directory.dead(error):
                    self._died([name], {name: incarnation(handle)})
            raise

    def forget(self, name: str) -> None:
        """Take a host out of the table until a reading finds it answering again."""
        self._suspects.add(name)
        handle = self._handles.pop(name, None)
        if handle is not None:
            self._last[name] = handle
            self._changed([name])
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.get_running_loop().create_task(self._read())

    async def refresh(self) -> None:
        """Read the directory again, off the loop; concurrent callers share one reading."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._read())
        await asyncio.shield(self._refreshing)

    async def _find(self, name: str) -> Any:
        """A host the table does not know: read again (a reading begun after this call, not
        one already under way, which may predate the host), then it is there or gone.

        A host that failed and is still listed is gone until it answers a ping: it
        costs no reading per message."""
        if name in self._suspects:
            raise HostGone(name, "it failed and has not answered since")
        for _ in range(2):
            under_way = self._refreshing is not None and not self._refreshing.done()
            await self.refresh()
            handle = self._handles.get(name)
            if handle is not None:
                return handle
            if not under_way:
                break
        raise HostGone(name, "no such host is running")

    async def _keep(self) -> None:
        while True:
            await self.clock.sleep(self.cadence)
            await self.refresh()

    async def _read(self) -> None:
        known = set(self._handles)
        try:
            found = await control_store_call(self._look_up, known)
        except Exception:
            log.exception("reading the host actors failed; the table stays as it was")
            return
        handles: dict[str, Any] = {}
        for name, handle in found.items():
            kept = handle if handle is not None else self._handles.get(name)
            if kept is not None and name not in self._suspects:
                handles[name] = kept
        vanished = sorted((set(self._handles) | self._suspects) - set(found))
        for name in vanished:
            if name in self._handles:
                self._last[name] = self._handles[name]
        self._announced -= set(found)
        self._suspects &= set(found)
        lost = sorted(set(self._handles) - set(handles))
        joined = sorted(set(handles) - set(self._handles))
        self._handles = handles
        self._changed(lost)
        if joined and self._keeper is not None:  # not the first reading, at start
            for listener in self._joined_listeners:
                listener(joined)
        self._died(vanished)
        self._ping({name: found[name] for name in self._suspects if found[name] is not None})

    def _died(self, names: list[str], known: Mapping[str, str | None] | None = None) -> None:
        for name in names:
            last = self._last.pop(name, None)
            if name in self._announced:
                continue
            self._announced.add(name)
            died = (known or {}).get(name) or incarnation(last)
            for listener in self._dead_listeners:
                listener(name, died)

    def _ping(self, suspects: dict[str, Any]) -> None:
        """Ping the listed suspects whose handle is not already being pinged, in a task of
        their own."""
        fresh = {
            name: handle
            for name, handle in suspects.items()
            if self._pinging.get(name) is not handle
        }
        if fresh:
            self._pinging.update(fresh)
            ping = asyncio.get_running_loop().create_task(self._readmit(fresh))
            self._pings.add(ping)
            ping.add_done_callback(self._pings.discard)

    async def _readmit(self, suspects: dict[str, Any]) -> None:
        """Take back the suspects that answer, unless a reading since found them gone."""
        try:
            answering = await asyncio.gather(
                *(self._answers(name, handle) for name, handle in suspects.items())
            )
        finally:
            for name, handle in suspects.items():
                if self._pinging.get(name) is handle:
                    del self._pinging[name]
        back = {name for name, answered in answering if answered and name in self._suspects}
        if back:
            self._suspects -= back
            self._handles = {**self._handles, **{name: suspects[name] for name in back}}
            self._changed([])

    def _look_up(self, known: set[str]) -> dict[str, Any]:
        """In a thread: every host's name, with a handle for the ones not known yet (None for
        the known ones, whose handle stays)."""
        found: dict[str, Any] = {}
        for name in self.directory.names():
            if name in known:
                found[name] = None
                continue
            try:
                found[name] = self.directory.handle(name)
            except (LookupError, ValueError):
                continue  # it went away between the two look-ups
        return found

    async def _answers(self, name: str, handle: Any) -> tuple[str, bool]:
        try:
            await self.bound(handle.ping.remote(), name)
            return name, True
        except Exception:
            return name, False

    def _changed(self, lost: list[str]) -> None:
        names = sorted(self._handles)
        self._draining &= set(names)
        self.workers = [n for n in names if n.startswith(WORKER_PREFIX) and n not in self._draining]
        self.controllers = [n for n in names if n.startswith(CONTROLLER_PREFIX)]
        for name in lost:
            log.warning("host %s is gone", name)
            for listener in self._listeners:
                listener(name)
