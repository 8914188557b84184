"""Creating the host actors of one node: the one way, for `connect` (every node) and for the
membership watch (a node that joined later).

The actor classes are passed in: the watch runs inside a controller host, whose module this
one may not import back.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .constants import controller_name, worker_name


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
    node_id: str,
    *,
    controller: bool,
    worker: bool,
    worker_share: int | None,
    workers_per_node: int,
    controller_class: type,
    worker_class: type,
) -> dict[str, Any]:
    """Create the node's missing host actors (idempotent: an existing one is returned); their
    handles by name. Blocks on Ray's control store; nothing waits for them to be ready."""
    hosts: dict[str, Any] = {}
    if controller:
        name = controller_name(node_id)
        hosts[name] = (
            ray.remote(controller_class)
            .options(name=name, namespace=namespace, **pinned(node_id))
            .remote(namespace, node_id)
        )
    if worker:
        for index in range(workers_per_node):
            name = worker_name(node_id, index)
            hosts[name] = (
                ray.remote(worker_class)
                .options(name=name, namespace=namespace, **pinned(node_id))
                .remote(namespace, node_id, worker_share, index)
            )
    return hosts
