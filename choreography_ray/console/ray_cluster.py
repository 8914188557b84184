"""The console's cluster view and storage, read from a Ray cluster the process has joined.

The only console module that imports Ray. It reads what the command line reads: the cluster's
configuration (storage URL, job modules) from Ray's key-value store, the nodes from Ray, and
each host's figures from the host itself, every call bounded.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from ..jobs.errors import ConfigurationError
from ..jobs.options import JobsOptions
from ..jobs.registry import default_registry
from ..runtime.config import (
    ClusterConfig,
    check_same_storage,
    import_modules,
    read_config,
    require_config,
)
from ..runtime.constants import CONTROLLER_PREFIX, WORKER_PREFIX
from ..runtime.directory import actor_names
from ..runtime.node_hosts import facts_of, roles_of
from ..runtime.packages import PackageFetch, fetch_joined
from ..runtime.remote_storage import open_cluster_storage
from ..storage.provider import StorageProvider
from .ports import ClusterSnapshot, HostView, NodeView

HOST_ANSWER_SECONDS = 2.0
"""How long the cluster page waits for one host's figures before it shows the host without."""


def cluster_storage(
    namespace: str, storage: str | None = None
) -> tuple[StorageProvider, ClusterConfig]:
    """The provider of the cluster's storage, with the cluster's job modules imported so their
    records read; `storage`, when given, must be the cluster's own."""
    config = require_config(namespace)
    return storage_of(config, namespace, storage, fetch_joined), config


def storage_of(
    config: ClusterConfig, namespace: str, storage: str | None, fetch: PackageFetch
) -> StorageProvider:
    """The provider of the storage `config` names, with its job modules imported so their
    records read (from the packages they were submitted with, through `fetch`, when this
    process lacks them); `storage`, when given, must be that one."""
    check_same_storage(config, storage)
    _, failed = import_modules(config.modules, packages=config.packages, fetch=fetch, quiet=True)
    if failed:
        raise ConfigurationError(f"cannot import the cluster's job modules: {'; '.join(failed)}")
    return open_cluster_storage(
        config.storage, namespace=namespace, modules=config.modules, options=config.jobs_options()
    )


class RayClusterView:
    """Nodes, roles and hosts of the job system in Ray namespace `namespace`."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    async def snapshot(self) -> ClusterSnapshot:
        nodes, names, config = await asyncio.to_thread(self._read)
        figures = await asyncio.gather(*(self._figures(name) for name in names))
        hosts: dict[str, list[HostView]] = {}
        for name, view in zip(names, figures, strict=True):
            node_id = name.removeprefix(CONTROLLER_PREFIX).removeprefix(WORKER_PREFIX)
            hosts.setdefault(node_id.split(":")[0], []).append(view)
        options = config.jobs_options() if config is not None else JobsOptions()
        roles = {r.node_id: r for r in roles_of(facts_of(nodes), options)}
        views = []
        for node in nodes:
            node_id = node["NodeID"]
            role = roles.get(node_id)
            views.append(
                NodeView(
                    node_id=node_id,
                    address=str(node.get("NodeManagerAddress", "")),
                    hostname=str(node.get("NodeManagerHostname", "")),
                    alive=bool(node.get("Alive")),
                    controller=bool(role and role.controller),
                    worker=bool(role and role.worker),
                    cpus=float(node.get("Resources", {}).get("CPU", 0)),
                    hosts=hosts.get(node_id, []),
                )
            )
        modules = config.modules if config is not None else []
        return ClusterSnapshot(
            nodes=views,
            modules=modules,
            job_types=default_registry.names("job"),
            namespace=self.namespace,
        )

    def _read(self) -> tuple[list[dict[str, Any]], list[str], ClusterConfig | None]:
        return ray.nodes(), actor_names(self.namespace), read_config(self.namespace)

    async def _figures(self, name: str) -> HostView:
        role = "controller" if name.startswith(CONTROLLER_PREFIX) else "worker"
        try:
            handle: Any = ray.get_actor(name, namespace=self.namespace)
            stats = await asyncio.wait_for(
                asyncio.wrap_future(handle.stats.remote().future()), HOST_ANSWER_SECONDS
            )
        except TimeoutError:
            return HostView(name, role, problem=f"no answer within {HOST_ANSWER_SECONDS:g} s")
        except Exception as error:
            return HostView(name, role, problem=f"unreachable: {type(error).__name__}")
        return HostView(
            name,
            role,
            active_runs=stats.get("active_runs"),
            max_parallel_steps=stats.get("max_parallel_steps"),
            live_jobs=stats.get("live_jobs"),
        )
