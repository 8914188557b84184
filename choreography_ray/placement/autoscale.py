"""How many worker nodes the cluster's unfinished steps ask Ray's autoscaler for.

A job system whose work only waits creates no demand Ray's autoscaler can see: no task, actor or
placement group is pending, so it launches nothing. The elected controller host therefore asks
for worker nodes in so many words — a resource request of one `choreography_worker` bundle per
node wanted, which the autoscaler meets with nodes of a type that declares that resource — and
asks again whenever the number changes. Nothing outstanding asks for no node: the request is
withdrawn and idle worker nodes scale down by Ray's own idle timeout.

The number: every step of the running jobs that has no outcome yet, divided by the steps one
worker node performs at once, rounded up, at most `autoscale_max_worker_nodes`. Nodes that run
already count toward it (the request is for the cluster's size, not on top of it). Plain
Python over the numbers, so the policy runs in-process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .roles import WORKER_RESOURCE


def wanted_nodes(outstanding: int, per_node: int, cap: int) -> int:
    """Worker nodes for `outstanding` steps at `per_node` steps at once each, at most `cap`."""
    if outstanding <= 0 or cap <= 0:
        return 0
    return min(cap, math.ceil(outstanding / max(1, per_node)))


def bundles(nodes: int) -> list[dict[str, float]]:
    """The resource request for `nodes` worker nodes: one role bundle each."""
    return [{WORKER_RESOURCE: 1.0} for _ in range(nodes)]


@dataclass
class Demand:
    """The elected controller's view of the cluster's demand: each controller host's last
    answer (a host that does not answer keeps its last one, so a slow host never makes the
    request shrink and grow again), and the request last made."""

    per_node: int
    cap: int
    answers: dict[str, int]
    requested: int | None = None
    """The number of nodes last asked for; None before the first request of this host."""

    @classmethod
    def of(cls, per_node: int, cap: int) -> Demand:
        return cls(per_node=per_node, cap=cap, answers={})

    def heard(self, answers: Mapping[str, int | None], live: set[str]) -> int:
        """Take the controllers' answers (None: no answer); forget hosts that are gone.
        Returns the nodes now wanted."""
        self.answers = {name: count for name, count in self.answers.items() if name in live}
        for name, count in answers.items():
            if count is not None:
                self.answers[name] = count
        return wanted_nodes(sum(self.answers.values()), self.per_node, self.cap)

    def due(self, nodes: int) -> bool:
        """Whether `nodes` must be asked for: it changed, or this host never asked (a request
        left by an earlier elected host is replaced)."""
        return self.requested != nodes


@dataclass
class Idleness:
    """Since when each worker node has been seen idle (seconds on the clock): a node whose
    hosts are idle long enough, while fewer worker nodes are wanted, is given back.

    A node is idle only as long as it was seen to be, reading after reading: idleness counts
    from the first reading that found it idle, never from the last that found it busy, and
    readings further apart than `gap` start every count again. Readings can stop for a while
    (the check waits for Ray's control store while it restarts; a host not elected makes
    none), and what ran meanwhile is not known: a node busy all through such a gap, idle at
    the reading after it, was given back at once."""

    idle_since: dict[str, float]
    gap: float = math.inf
    last: float | None = None
    """When the last reading was taken."""

    @classmethod
    def of(cls, gap: float = math.inf) -> Idleness:
        return cls(idle_since={}, gap=gap)

    def seen(self, loads: Mapping[str, bool], now: float) -> dict[str, float]:
        """Take each node's reading (busy or not); returns how long each has been idle.
        A node seen for the first time counts as just busy: it may be about to get work."""
        known = self.last is not None and now - self.last <= self.gap
        self.last = now
        since = {
            node: at for node, at in self.idle_since.items() if known and loads.get(node) is False
        }
        for node, busy in loads.items():
            if not busy:
                since.setdefault(node, now)
        self.idle_since = since
        return {node: now - since.get(node, now) for node in loads}

    def worked(self, node: str) -> None:
        """The node took work after all (its hosts refused to leave): idle from the next
        reading on, if it is idle then."""
        self.idle_since.pop(node, None)


def to_retire(idle: Mapping[str, float], wanted: int, timeout: float) -> list[str]:
    """The worker nodes whose hosts leave them: as many as there are nodes beyond `wanted`,
    among those idle for `timeout` at least, the longest idle first. A 0-CPU actor keeps a
    node busy in Ray's autoscaler's eyes (Ray 2.60): without this no node ever goes."""
    excess = len(idle) - wanted
    if excess <= 0:
        return []
    ready = sorted(((seconds, node) for node, seconds in idle.items() if seconds >= timeout))
    return [node for _, node in reversed(ready)][:excess]


def to_restore(retired: list[str], hosted: int, wanted: int) -> list[str]:
    """Retired nodes that are still there and whose hosts come back: as many as the nodes
    wanted beyond those that have hosts (a node at hand before a new one)."""
    return sorted(retired)[: max(0, wanted - hosted)]
