"""The actors of a namespace as Ray knows them: the directory behind `routes.Routes`, and the
one listing of them by name that the client, placement and the command line use too."""

from __future__ import annotations

from typing import Any

import ray

from .constants import HOST_PREFIXES
from .remote import is_host_gone


def actor_names(namespace: str, prefixes: tuple[str, ...] = HOST_PREFIXES) -> list[str]:
    """The names of the namespace's actors that start with one of `prefixes`, sorted (a
    blocking call to Ray's control store)."""
    return sorted(
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry.get("namespace") == namespace and entry.get("name", "").startswith(prefixes)
    )


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
