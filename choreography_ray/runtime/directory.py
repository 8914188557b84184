"""The actors of a namespace as Ray knows them: the directory behind `routes.Routes`, and the
one listing of them by name that the client, placement and the command line use too."""

from __future__ import annotations

import logging
from typing import Any

import ray

from .constants import HOST_PREFIXES
from .remote import is_host_gone

log = logging.getLogger("choreography_ray.runtime")
_unreadable: list[str] = []
"""Why the actor table could not be read, once said (the watch reads every second)."""


def actor_names(namespace: str, prefixes: tuple[str, ...] = HOST_PREFIXES) -> list[str]:
    """The names of the namespace's actors that start with one of `prefixes`, sorted (a
    blocking call to Ray's control store)."""
    return sorted(
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry.get("namespace") == namespace and entry.get("name", "").startswith(prefixes)
    )


def host_incarnations(namespace: str) -> dict[str, str] | None:
    """Each live host actor of the namespace's name -> its actor id, from one reading of Ray's
    actor table (a blocking call to the control store); None when the table cannot be read.

    Ray lists named actors by name only, and a host killed and started again keeps its name;
    the actor id tells them apart. Ray's public reader of the actor table (`ray.util.state`)
    needs the dashboard, so this reads it through the private accessor `ray.nodes()` uses
    (docs/decisions.md); if a Ray release changes it, replacements go unseen by the reading,
    and are found when a call to the dead host fails, as before."""
    try:
        from ray._private.state import state
        from ray.core.generated import gcs_pb2

        found: dict[str, str] = {}
        for raw in state._connect_and_get_accessor().get_actor_table(None, "ALIVE"):
            actor = gcs_pb2.ActorTableData.FromString(raw)  # type: ignore[attr-defined]  # protobuf
            if actor.ray_namespace == namespace and actor.name.startswith(HOST_PREFIXES):
                found[actor.name] = actor.actor_id.hex()
        return found
    except Exception as error:
        if not _unreadable:
            _unreadable.append(str(error))
            log.warning("Ray's actor table cannot be read (%s): host replacements go unseen", error)
        return None


class RayDirectory:
    """Ray's named actors of one namespace. Every method but `gone` blocks on Ray's control
    store: `Routes` calls them in a thread."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def names(self) -> list[str]:
        return actor_names(self.namespace)

    def handle(self, name: str) -> Any:
        return ray.get_actor(name, namespace=self.namespace)

    def gone(self, error: BaseException) -> bool:
        return is_host_gone(error)

    def dead(self, error: BaseException) -> bool:
        return isinstance(error, ray.exceptions.ActorDiedError)


def draining_nodes() -> dict[str, float]:
    """The nodes Ray drains now, with when each is to go (seconds since the epoch, 0 for no
    deadline), from the control store's draining-node table; empty when it cannot be read.

    `ray.nodes()` shows a draining node as alive like any other; the table is read through
    the control store client, as Ray Serve reads it (docs/decisions.md)."""
    try:
        client = ray._private.worker.global_worker.gcs_client  # type: ignore[attr-defined]
        table = client.get_draining_nodes(timeout=10)
    except Exception as error:
        log.warning("the draining nodes could not be read: %s", error)
        return {}
    return {
        (node.hex() if isinstance(node, bytes | bytearray) else str(node)): deadline / 1000
        for node, deadline in table.items()
    }
