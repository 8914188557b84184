"""The cluster as recovery sees it: snapshots of its nodes and host actors, what changed between
two of them, and who recovers.

A controller host reads a snapshot every `membership_interval` (the runtime reads Ray's node
table and named actors); the difference to the previous one says which nodes died or joined and
which host actors went away or appeared. A host actor is gone when it is no longer listed, or
when its node is no longer alive: Ray may list a dead node's actors for a moment. Plain data
and functions, so the rules run in-process without Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeInfo:
    """One node of the cluster, as the node table describes it."""

    node_id: str
    alive: bool
    address: str = ""
    """Where the node's raylet listens (host:port); breaks ties between nodes that started
    at the same time."""
    started: float | None = None
    """When the node started (seconds since the epoch); None when Ray did not say."""
    controller: bool = False
    worker: bool = False
    """The roles placement gives the node."""

    @property
    def has_role(self) -> bool:
        return self.controller or self.worker


@dataclass(frozen=True)
class ClusterSnapshot:
    """The nodes Ray knows (alive or dead) and the host actors it lists, each with the node it
    runs on."""

    nodes: Mapping[str, NodeInfo] = field(default_factory=dict)
    hosts: Mapping[str, str] = field(default_factory=dict)
    """Host actor name -> node id."""
    incarnations: Mapping[str, str] = field(default_factory=dict)
    """Host actor name -> which actor bears the name (Ray's actor id), where known: a host
    killed and started again between two readings keeps its name but not its incarnation."""
    draining: Mapping[str, float] = field(default_factory=dict)
    """Live nodes Ray is draining (a preemption or idle-termination notice), with the time
    they are to go (seconds since the epoch; 0 when the drain set none)."""

    @classmethod
    def of(
        cls,
        nodes: Iterable[NodeInfo],
        hosts: Mapping[str, str],
        incarnations: Mapping[str, str] | None = None,
        draining: Mapping[str, float] | None = None,
    ) -> ClusterSnapshot:
        return cls(
            {node.node_id: node for node in nodes},
            dict(hosts),
            dict(incarnations or {}),
            dict(draining or {}),
        )

    def alive(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        return node is not None and node.alive

    @property
    def live_hosts(self) -> frozenset[str]:
        """The listed host actors whose node is alive."""
        return frozenset(name for name, node in self.hosts.items() if self.alive(node))


@dataclass(frozen=True)
class MembershipChange:
    """What happened between two snapshots."""

    dead_nodes: frozenset[str] = frozenset()
    """Nodes alive before and dead (or gone from the table) now."""
    joined_nodes: frozenset[str] = frozenset()
    """Live nodes the earlier snapshot did not have alive."""
    hosts_gone: frozenset[str] = frozenset()
    """Host actors live before and gone now: on a dead node, or killed while their node
    lives."""
    hosts_appeared: frozenset[str] = frozenset()
    draining_nodes: frozenset[str] = frozenset()
    """Live nodes Ray began to drain since the earlier snapshot."""

    @property
    def empty(self) -> bool:
        return not (
            self.dead_nodes
            or self.joined_nodes
            or self.hosts_gone
            or self.hosts_appeared
            or self.draining_nodes
        )

    @property
    def losses(self) -> bool:
        """Whether something died: the change that asks for a recovery pass."""
        return bool(self.dead_nodes or self.hosts_gone)


def diff(before: ClusterSnapshot, after: ClusterSnapshot) -> MembershipChange:
    """The change from `before` to `after`."""
    was_alive = {node_id for node_id, node in before.nodes.items() if node.alive}
    now_alive = {node_id for node_id, node in after.nodes.items() if node.alive}
    was_hosts = before.live_hosts
    now_hosts = after.live_hosts
    replaced = {
        name
        for name in was_hosts & now_hosts
        if (was := before.incarnations.get(name)) is not None
        and (now := after.incarnations.get(name)) is not None
        and was != now
    }
    return MembershipChange(
        dead_nodes=frozenset(was_alive - now_alive),
        joined_nodes=frozenset(now_alive - was_alive),
        hosts_gone=frozenset((was_hosts - now_hosts) | replaced),
        hosts_appeared=frozenset((now_hosts - was_hosts) | replaced),
        draining_nodes=frozenset(n for n in after.draining if n not in before.draining),
    )


def _age(snapshot: ClusterSnapshot, host: str) -> tuple[float, str, str]:
    node = snapshot.nodes[snapshot.hosts[host]]
    started = node.started if node.started is not None else float("inf")
    return (started, node.address, host)


def elected(snapshot: ClusterSnapshot, controllers: Iterable[str]) -> str | None:
    """The oldest live controller host among `controllers`: by its node's start, ties broken
    by the node's address (then by name, so every host agrees); None when none lives. A host
    whose node is draining is elected only when every one is."""
    live = [name for name in controllers if name in snapshot.live_hosts]
    staying = [name for name in live if snapshot.hosts[name] not in snapshot.draining]
    return min(staying or live, key=lambda name: _age(snapshot, name), default=None)


def recovers(
    me: str, snapshot: ClusterSnapshot, controllers: Iterable[str], complete: bool
) -> bool:
    """Whether controller host `me` runs the recovery pass (the seed's rule): with a complete
    key catalog only the elected host does, since every host finds every partition; without
    one every survivor does, since electing one would miss keys only another one knows. A host
    that sees no live controller (not even itself, listed) recovers too."""
    if not complete:
        return True
    chosen = elected(snapshot, controllers)
    return chosen is None or chosen == me


class Deaths:
    """The host incarnations (Ray's actor ids) whose death was told to the jobs here: each is
    told once, however many readers notice it. A host killed and started again keeps its
    name, so a name cannot say which death a late notice is about; its incarnation can."""

    LIMIT = 4096
    """Incarnations remembered; the oldest are forgotten first (deaths are rare)."""

    def __init__(self) -> None:
        self._told: dict[str, None] = {}

    def first(self, incarnation: str | None) -> bool:
        """Whether this death is to be told: True the first time, and always for an
        incarnation that is not known (None)."""
        if incarnation is None:
            return True
        if incarnation in self._told:
            return False
        self._told[incarnation] = None
        if len(self._told) > self.LIMIT:
            del self._told[next(iter(self._told))]
        return True
