"""Which node takes which host role, decided from the facts a node declares.

A node that declares the custom resource `choreography_controller` runs a controller host; one
that declares `choreography_worker` runs worker hosts. While no node of the cluster declares
either, every node takes both roles (a laptop, a cluster started without roles). Plain Python
over `NodeFacts`, so the rule is tested without a cluster; the runtime reads the facts from Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..jobs.errors import InvalidOptionError

CONTROLLER_RESOURCE = "choreography_controller"
WORKER_RESOURCE = "choreography_worker"
"""Custom resources a node declares to take a role."""


@dataclass(frozen=True)
class NodeFacts:
    """What placement needs to know of a node."""

    node_id: str
    alive: bool = True
    resources: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeRoles:
    node_id: str
    controller: bool
    worker: bool


def assign_roles(nodes: Iterable[NodeFacts]) -> list[NodeRoles]:
    """The roles of every live node; a node that takes none is left out."""
    live = [node for node in nodes if node.alive]
    declared = any(
        CONTROLLER_RESOURCE in node.resources or WORKER_RESOURCE in node.resources for node in live
    )
    roles = []
    for node in live:
        controller = not declared or CONTROLLER_RESOURCE in node.resources
        worker = not declared or WORKER_RESOURCE in node.resources
        if controller or worker:
            roles.append(NodeRoles(node.node_id, controller, worker))
    return roles


def check_workers_per_node(workers_per_node: object) -> int:
    """`workers_per_node` if it is a whole number of worker hosts, at least 1: the one rule,
    for `connect`'s arguments (checked before Ray) and for placement itself."""
    if isinstance(workers_per_node, bool) or not isinstance(workers_per_node, int):
        raise InvalidOptionError(
            "workers_per_node", f"expected an integer, got {workers_per_node!r}"
        )
    if workers_per_node < 1:
        raise InvalidOptionError("workers_per_node", f"must be at least 1, got {workers_per_node}")
    return workers_per_node


def worker_share(max_parallel_steps: int | None, workers_per_node: int) -> int | None:
    """Each worker host's part of its node's `max_parallel_steps` (rounded up; None: default).

    The throttle stays per node when a node runs several worker hosts."""
    check_workers_per_node(workers_per_node)
    if max_parallel_steps is None:
        return None
    return max(1, -(-max_parallel_steps // workers_per_node))
