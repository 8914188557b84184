"""Which node takes which host role, decided from the facts a node declares.

A node declares its role with a Ray node label (`choreography.io/role` by default, values
`controller`, `worker` or `both`: Ray's recommended way, `ray start --labels`) or with the custom
resources `choreography_controller` / `choreography_worker`; a node declaring both ways takes
the union. While no live node of the cluster declares any role, every node takes both (a laptop,
a cluster started without roles). A worker node runs `workers_per_node` worker hosts when that
is given, else a number derived from its own CPUs (`engine.limits.worker_hosts`). Plain Python
over `NodeFacts`, so the rule is tested without a cluster; the runtime reads the facts from Ray.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..engine.limits import worker_hosts
from ..jobs.errors import InvalidOptionError
from .parallelism import PARALLELISM_LABEL, node_parallelism

log = logging.getLogger("choreography_ray.placement")

CONTROLLER_RESOURCE = "choreography_controller"
WORKER_RESOURCE = "choreography_worker"
"""Custom resources a node declares to take a role."""

ROLE_LABEL = "choreography.io/role"
"""The node label that names a node's role, unless the `role_label` option names another."""

ROLE_VALUES: dict[str, tuple[bool, bool]] = {
    "controller": (True, False),
    "worker": (False, True),
    "both": (True, True),
}
"""The values of the role label, and the (controller, worker) roles each gives."""


@dataclass(frozen=True)
class NodeFacts:
    """What placement needs to know of a node."""

    node_id: str
    alive: bool = True
    resources: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeRoles:
    """The roles a node takes, how many steps it performs at once (None: the default), and,
    for a worker node, how many worker hosts it runs."""

    node_id: str
    controller: bool
    worker: bool
    max_parallel_steps: int | None = None
    worker_hosts: int = 1


def refused_role(node: NodeFacts, role_label: str = ROLE_LABEL) -> str | None:
    """Why the node's role label cannot be read, in one line; None when it can (or is absent)."""
    value = node.labels.get(role_label)
    if value is None or value.strip().lower() in ROLE_VALUES:
        return None
    return (
        f"node {node.node_id}: label {role_label}={value!r} is not one of {', '.join(ROLE_VALUES)}"
    )


def declared_roles(node: NodeFacts, role_label: str = ROLE_LABEL) -> tuple[bool, bool] | None:
    """The (controller, worker) roles the node declares by label or resource; None when it
    declares nothing. A role label that cannot be read declares no role (it still declares)."""
    value = node.labels.get(role_label)
    by_resource = CONTROLLER_RESOURCE in node.resources, WORKER_RESOURCE in node.resources
    if value is None and not any(by_resource):
        return None
    by_label = ROLE_VALUES.get(value.strip().lower(), (False, False)) if value else (False, False)
    return by_label[0] or by_resource[0], by_label[1] or by_resource[1]


def assign_roles(
    nodes: Iterable[NodeFacts],
    *,
    role_label: str = ROLE_LABEL,
    parallelism_label: str = PARALLELISM_LABEL,
    max_parallel_steps: int | None = None,
    workers_per_node: int | None = None,
) -> list[NodeRoles]:
    """The roles of every live node; a node that takes none is left out.

    A worker node's `max_parallel_steps` comes from its `parallelism_label`, else
    `max_parallel_steps` (the cluster's value); its worker hosts are `workers_per_node` when
    given, else derived from its own CPUs and that limit (`worker_hosts`)."""
    workers_per_node = check_workers_per_node(workers_per_node)
    live = [node for node in nodes if node.alive]
    declared = {node.node_id: declared_roles(node, role_label) for node in live}
    anyone = any(roles is not None for roles in declared.values())
    assigned = []
    for node in live:
        if (problem := refused_role(node, role_label)) is not None:
            log.warning("%s: the node takes no role", problem)
        controller, worker = declared[node.node_id] or (not anyone, not anyone)
        if controller or worker:
            parallel, hosts = None, 1
            if worker:
                parallel = node_parallelism(
                    node.node_id, node.labels, parallelism_label, max_parallel_steps
                )
                hosts = workers_per_node or worker_hosts(node.resources.get("CPU"), parallel)
            assigned.append(NodeRoles(node.node_id, controller, worker, parallel, hosts))
    return assigned


def check_workers_per_node(workers_per_node: object) -> int | None:
    """`workers_per_node` if it is None (each node's own number, from its CPUs) or a whole
    number of worker hosts, at least 1: the one rule, for `connect`'s arguments (checked before
    Ray) and for placement itself."""
    if workers_per_node is None:
        return None
    if isinstance(workers_per_node, bool) or not isinstance(workers_per_node, int):
        raise InvalidOptionError(
            "workers_per_node", f"expected an integer or None, got {workers_per_node!r}"
        )
    if workers_per_node < 1:
        raise InvalidOptionError("workers_per_node", f"must be at least 1, got {workers_per_node}")
    return workers_per_node
