"""The host actors of a namespace as Ray knows them: the directory behind `routes.Routes`."""

from __future__ import annotations

from typing import Any

import ray

from ..recovery.liveness import HostGone
from .constants import CONTROLLER_PREFIX, WORKER_PREFIX


class RayDirectory:
    """Ray's named actors of one namespace. Every method but `gone` blocks on Ray's control
    store: `Routes` calls them in a thread."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def names(self) -> list[str]:
        return sorted(
            entry["name"]
            for entry in ray.util.list_named_actors(all_namespaces=True)
            if entry.get("namespace") == self.namespace
            and entry.get("name", "").startswith((CONTROLLER_PREFIX, WORKER_PREFIX))
        )

    def handle(self, name: str) -> Any:
        return ray.get_actor(name, namespace=self.namespace)

    def gone(self, error: BaseException) -> bool:
        return isinstance(error, HostGone | ray.exceptions.RayActorError)
