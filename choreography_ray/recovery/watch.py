"""The membership watch of a controller host: what it reads, how often, and what it does.

Every `interval` it reads a cluster snapshot in a thread (reading Ray's tables blocks), never
per message. On the difference to the previous reading:

- host actors gone (their node died, or their process was killed): the host's job activations
  are told at once, so the steps those hosts took are sent again;
- something died: a recovery pass over every partition of the key catalog, on the elected
  host, or on every host while the catalog is incomplete (`membership.recovers`). Passes never
  overlap: a death during one asks for one more after it. The pass rehydrates partitions
  already known again, and never waits behind a partition's retry chain;
- a node joined with a role, or a host actor gone while its node lives: the elected host
  starts the node's missing host actors (idempotent), retried alone after a failure, so no
  `up` is needed; never while the cluster is being taken down (`choreography down`);
- any host appeared or went away: the routing table is read again.

The first reading is the baseline: the host's own start already recovers. Plain Python over a
`Participant` and the injectable clock, so it runs in-process under a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from ..engine.clock import Clock
from .keys import KeyCatalog
from .membership import ClusterSnapshot, MembershipChange, NodeInfo, diff, elected, recovers
from .retries import Retries

log = logging.getLogger("choreography_ray.recovery")


class Participant(Protocol):
    """What the watch acts through: the controller host it runs in."""

    name: str

    def is_controller(self, host: str) -> bool: ...

    async def hosts_lost(self, names: Mapping[str, str | None]) -> Any:
        """Tell every job activation here that these host actors are gone: each name with
        the incarnation (Ray's actor id) that died, None when it is not known."""
        ...

    async def catalog(self) -> KeyCatalog:
        """The partitions to recover, and whether every source answered."""
        ...

    async def rehydrate(self, catalog: KeyCatalog) -> None:
        """Rehydrate every partition of `catalog` (and those the host knows), known or not."""
        ...

    async def start_node(self, node: NodeInfo) -> None:
        """Start the missing host actors of a node with a role; idempotent."""
        ...

    async def taking_down(self) -> bool:
        """Whether the cluster's hosts are being stopped (`down`): then none is started."""
        ...

    async def nodes_draining(self, drains: Mapping[str, float]) -> None:
        """Ray began to drain these nodes (node id -> when they go, seconds since the epoch,
        0 for no deadline): their hosts take no new work and hand theirs over."""
        ...

    async def retired(self, node_id: str) -> bool:
        """Whether the node's hosts left it, idle, for Ray's autoscaler to remove it: they
        are not started again behind it."""
        ...

    async def hosts_changed(self) -> None:
        """Host actors appeared or went away: read the routing table again."""
        ...


class MembershipWatch:
    """Reads snapshots with `read` (blocking, run in a thread by `off_loop`) and reacts
    through `host`."""

    def __init__(
        self,
        host: Participant,
        read: Callable[[], ClusterSnapshot],
        clock: Clock,
        *,
        interval: float,
        off_loop: Callable[[Callable[[], ClusterSnapshot]], Awaitable[ClusterSnapshot]] = (
            asyncio.to_thread
        ),
    ) -> None:
        """`off_loop` runs `read` in a thread: the runtime's own threads for Ray's tables,
        which hang while its control store restarts (never the loop's default executor,
        which the steps use)."""
        self.host = host
        self.read = read
        self.off_loop = off_loop
        self.clock = clock
        self.interval = interval
        self.latest: ClusterSnapshot | None = None
        self.lost: list[str] = []
        """Every host actor this watch reported gone, in order (stats, tests)."""
        self.passes = 0
        """Recovery passes run (or begun) here."""
        self.started: list[str] = []
        """Nodes whose host actors this watch started."""
        self._loop: asyncio.Task[None] | None = None
        self._pass: asyncio.Task[None] | None = None
        self._again = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._starts: Retries[str] = Retries(
            self._start_node, clock, what=f"{host.name}: starting the host actors of node"
        )

    async def start(self) -> None:
        """Take the baseline reading, then keep reading until `close`."""
        if self._loop is None:
            try:
                self.latest = await self.off_loop(self.read)
            except Exception:  # the next reading that works is the baseline
                log.exception("%s: reading the cluster's membership failed", self.host.name)
            self._loop = asyncio.get_running_loop().create_task(self._keep())

    def close(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
        if self._pass is not None:
            self._pass.cancel()
        for task in list(self._tasks):
            task.cancel()
        self._starts.close()

    async def _keep(self) -> None:
        while True:
            await self.clock.sleep(self.interval)
            try:
                await self.check()
            except Exception:
                log.exception("%s: reading the cluster's membership failed", self.host.name)

    async def check(self) -> MembershipChange:
        """Read once and react to what changed; returns the change."""
        snapshot = await self.off_loop(self.read)
        before, self.latest = self.latest, snapshot
        if before is None:
            return MembershipChange()
        change = diff(before, snapshot)
        if change.empty:
            return change
        log.info(
            "%s: membership changed: dead nodes %s, joined nodes %s, hosts gone %s, "
            "hosts appeared %s, draining nodes %s",
            self.host.name,
            sorted(change.dead_nodes),
            sorted(change.joined_nodes),
            sorted(change.hosts_gone),
            sorted(change.hosts_appeared),
            sorted(change.draining_nodes),
        )
        if change.draining_nodes:
            drains = {node: snapshot.draining[node] for node in change.draining_nodes}
            self._spawn(self.host.nodes_draining(drains))
        if change.hosts_gone or change.hosts_appeared:
            self._spawn(self.host.hosts_changed())
        if change.hosts_gone:
            self.lost.extend(sorted(change.hosts_gone))
            gone = {name: before.incarnations.get(name) for name in sorted(change.hosts_gone)}
            self._spawn(self.host.hosts_lost(gone))
        if change.losses:
            self.request_pass()
        self._start_nodes(snapshot, change.joined_nodes | _killed(before, snapshot, change))
        return change

    def _controllers(self, snapshot: ClusterSnapshot) -> Iterable[str]:
        return [name for name in snapshot.hosts if self.host.is_controller(name)]

    @property
    def elected(self) -> bool:
        """Whether this host is the elected one in the latest reading (true before any: a
        duty nobody takes is worse than one taken twice)."""
        return self.latest is None or self._elected(self.latest)

    def _elected(self, snapshot: ClusterSnapshot) -> bool:
        chosen = elected(snapshot, self._controllers(snapshot))
        return chosen is None or chosen == self.host.name

    # -- the recovery pass ----------------------------------------------------------------------

    def request_pass(self) -> None:
        """Run a recovery pass now, or once more after the one under way."""
        if self._pass is not None and not self._pass.done():
            self._again = True
            return
        self._pass = asyncio.get_running_loop().create_task(self._passes())

    async def _passes(self) -> None:
        while True:
            self._again = False
            try:
                await self._one_pass()
            except Exception:
                log.exception("%s: a recovery pass failed", self.host.name)
            if not self._again:
                return

    async def _one_pass(self) -> None:
        catalog = await self.host.catalog()
        snapshot = self.latest
        if snapshot is not None and not recovers(
            self.host.name, snapshot, self._controllers(snapshot), catalog.complete
        ):
            return  # the elected host recovers every partition of the complete catalog
        self.passes += 1
        await self.host.rehydrate(catalog)

    # -- joined nodes and killed hosts ------------------------------------------------------------

    def _start_nodes(self, snapshot: ClusterSnapshot, node_ids: frozenset[str]) -> None:
        """On the elected host: start the missing host actors of these live nodes with a role
        (a node that joined, or one whose host actor was killed)."""
        if not node_ids or not self._elected(snapshot):
            return
        for node_id in sorted(node_ids):
            if snapshot.alive(node_id) and snapshot.nodes[node_id].has_role:
                self._spawn(self._start_quietly(node_id))

    def start_hosts_of(self, node_id: str) -> None:
        """Start the hosts of a live node now (one whose retirement was taken back)."""
        self._spawn(self._start_quietly(node_id))

    async def _start_quietly(self, node_id: str) -> None:
        with contextlib.suppress(Exception):  # logged and retried by `_starts`
            await self._starts.run(node_id)

    async def _start_node(self, node_id: str) -> None:
        snapshot = self.latest
        if snapshot is None or not snapshot.alive(node_id):
            return  # it left again: nothing to start
        if await self.host.taking_down():
            log.info(
                "%s: the cluster is being taken down; node %s gets no hosts",
                self.host.name,
                node_id,
            )
            return  # `up` starts them, and clears the mark
        if node_id in snapshot.draining or await self.host.retired(node_id):
            return  # it is going (drained), or its hosts left it for the autoscaler
        await self.host.start_node(snapshot.nodes[node_id])
        self.started.append(node_id)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "%s: reacting to a membership change failed",
                self.host.name,
                exc_info=task.exception(),
            )


def _killed(
    before: ClusterSnapshot, after: ClusterSnapshot, change: MembershipChange
) -> frozenset[str]:
    """The live nodes whose host actors went away: their processes were killed (or stopped).
    A host already started again under its name (another incarnation) needs no start."""
    return frozenset(
        node_id
        for name in change.hosts_gone
        if (node_id := before.hosts.get(name)) is not None
        and after.alive(node_id)
        and name not in after.hosts
    )
