"""The nodes as placement sees them, and creating the host actors of one node: the one way,
for `connect` (every node) and for the membership watch (a node that joined later).

The actor classes are passed in: the watch runs inside a controller host, whose module this
one may not import back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..jobs.options import JobsOptions
from ..placement.roles import NodeFacts, NodeRoles, assign_roles
from .constants import controller_name, worker_name


def facts_of(table: Iterable[Mapping[str, Any]]) -> list[NodeFacts]:
    """Placement's facts of the nodes in Ray's node table (`ray.nodes()`)."""
    return [
        NodeFacts(
            node["NodeID"],
            bool(node.get("Alive")),
            dict(node.get("Resources") or {}),
            {str(k): str(v) for k, v in (node.get("Labels") or {}).items()},
        )
        for node in table
    ]


def node_facts() -> list[NodeFacts]:
    """Every node Ray knows, with whether it is alive, its resources and its labels (a blocking
    read of Ray's control store)."""
    return facts_of(ray.nodes())


def roles_of(
    facts: Iterable[NodeFacts],
    options: JobsOptions,
    max_parallel_steps: int | None = None,
    workers_per_node: int | None = None,
) -> list[NodeRoles]:
    """The roles of every live node under the options' labels, each worker node with its own
    step limit and its number of worker hosts (`workers_per_node`, else from its CPUs)."""
    return assign_roles(
        facts,
        role_label=options.role_label,
        parallelism_label=options.parallelism_label,
        max_parallel_steps=max_parallel_steps or options.max_parallel_steps,
        workers_per_node=workers_per_node,
    )


def node_roles(
    options: JobsOptions, max_parallel_steps: int | None = None, workers_per_node: int | None = None
) -> list[NodeRoles]:
    """The roles of every live node, with each worker node's own step limit and hosts."""
    return roles_of(node_facts(), options, max_parallel_steps, workers_per_node)


def pinned(node_id: str) -> dict[str, Any]:
    """Actor options of a host: named elsewhere, detached, on `node_id` and nowhere else,
    created once (`get_if_exists`), never restarted by Ray (a new one reads storage back)."""
    return {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
        "lifetime": "detached",
        "get_if_exists": True,
        "num_cpus": 0,
        "max_concurrency": 10_000,
        "max_restarts": 0,
    }


def create_node_hosts(
    namespace: str,
    roles: NodeRoles,
    *,
    controller_class: type,
    worker_class: type,
) -> dict[str, Any]:
    """Create the node's missing host actors (idempotent: an existing one is returned); their
    handles by name. A worker node gets `roles.worker_hosts` worker hosts, which share its step
    limit (`engine.limits.step_limits`). Blocks on Ray's control store; nothing waits for them
    to be ready."""
    node_id = roles.node_id
    hosts: dict[str, Any] = {}
    if roles.controller:
        name = controller_name(node_id)
        hosts[name] = (
            ray.remote(controller_class)
            .options(name=name, namespace=namespace, **pinned(node_id))
            .remote(namespace, node_id)
        )
    if roles.worker:
        for index in range(roles.worker_hosts):
            name = worker_name(node_id, index)
            hosts[name] = (
                ray.remote(worker_class)
                .options(name=name, namespace=namespace, **pinned(node_id))
                .remote(namespace, node_id, roles.max_parallel_steps, index, roles.worker_hosts)
            )
    return hosts
