"""Names every host and client agrees on."""

from __future__ import annotations

NAMESPACE = "choreography"
"""The Ray namespace of the host actors (configurable per cluster)."""

CONTROLLER_RESOURCE = "choreography_controller"
WORKER_RESOURCE = "choreography_worker"
"""Custom resources a node declares to take a role. A node that declares neither takes both
roles while no node of the cluster declares any (a laptop)."""

CONFIG_KEY = b"choreography_ray:cluster-config"
STORAGE_ACTOR = "choreography:storage"


def controller_name(node_id: str) -> str:
    return f"choreography:controller:{node_id}"


def worker_name(node_id: str, index: int = 0) -> str:
    """The first worker host of a node keeps the plain name; more get a number."""
    return f"choreography:worker:{node_id}" + (f":{index}" if index else "")
