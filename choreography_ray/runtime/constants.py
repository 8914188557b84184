"""Names every host and client agrees on."""

from __future__ import annotations

NAMESPACE = "choreography"
"""The Ray namespace of the host actors (configurable per cluster)."""

CONFIG_KEY = b"choreography_ray:cluster-config"
DOWN_KEY = b"choreography_ray:taking-down"
"""Set by `down` while (and after) it stops the hosts, cleared when hosts are started again:
the membership watch starts no host meanwhile."""
STORAGE_ACTOR = "choreography:storage"


ACTOR_PREFIX = "choreography:"
"""Every actor of the job system: its hosts and the `memory://` storage actor."""
CONTROLLER_PREFIX = "choreography:controller:"
WORKER_PREFIX = "choreography:worker:"
HOST_PREFIXES = (CONTROLLER_PREFIX, WORKER_PREFIX)

ROUTES_REFRESH_SECONDS = 10.0
"""How often a host reads the list of host actors again, besides when a call to one fails."""


def controller_name(node_id: str) -> str:
    return CONTROLLER_PREFIX + node_id


def worker_name(node_id: str, index: int = 0) -> str:
    """The first worker host of a node keeps the plain name; more get a number."""
    return WORKER_PREFIX + node_id + (f":{index}" if index else "")


def host_node(name: str) -> str:
    """The node id in a host actor's name (`choreography:worker:<node id>[:<index>]`)."""
    for prefix in HOST_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :].split(":", 1)[0]
    raise ValueError(f"{name!r} is not the name of a host actor")
