"""The host actors: the only Ray actors the job system creates, and what both roles share.

A controller host (`controller_host`) runs jobs managers and job activations; a worker host
(`worker_host`) runs step activations and the node's step throttle. Both are named, detached,
one per role per node, pinned to their node, and addressable from any driver. Everything they
know comes from storage and the cluster configuration, so a host that dies is replaced by a
fresh one that reads it back.
"""

from __future__ import annotations

import time
from typing import Any

from ..engine.clock import SystemClock
from ..jobs.registry import TypeKind, default_registry
from ..placement.capability import HostAdvert
from ..recovery.retries import Startup
from .adverts import advertised_capabilities, node_of, write_advert
from .cluster_storage import open_cluster_storage
from .config import import_modules
from .control_calls import control_store_call
from .directory import RayDirectory
from .fence import ray_fence
from .host_process import cluster_config, configure_logging, tune_gc
from .remote_storage import RemoteMemoryStorage
from .routes import Routes


class Host:
    """What both roles share: identity, configuration, job modules and storage."""

    def __init__(self, namespace: str, node_id: str, name: str) -> None:
        configure_logging()
        tune_gc()
        self.namespace = namespace
        self.node_id = node_id
        self.name = name
        self.epoch = time.time_ns()
        """Tells this host apart from an earlier one of the same name (job ownership)."""
        config = cluster_config(namespace)
        self.modules, failed = import_modules(config.modules)
        self.failed_modules: dict[str, str] = _by_module(failed)
        """Modules this host could not import, with the reason: advertised, never fatal."""
        self.options = config.jobs_options()
        self.clock = SystemClock()
        self.routes = Routes(
            RayDirectory(namespace),
            timeout=self.options.host_call_timeout.total_seconds(),
            clock=self.clock,
        )
        self.provider = open_cluster_storage(
            config.storage, namespace=namespace, modules=config.modules, options=self.options
        )
        self._startup = Startup(self._start, self.clock, what=name)
        self._node: tuple[dict[str, str], dict[str, float]] | None = None
        self.ready_at: float | None = None
        """When the host had started (seconds since the epoch): a benchmark's mark."""
        self.fence = ray_fence(name, node_id, namespace)
        """Ends this process once it is no longer part of the cluster (runtime/fence.py)."""
        self.fence.start()

    async def ready(self) -> int:
        """Wait until the host has started (storage open, routing table read, and for a
        controller host known partitions rehydrated); the host's epoch. A start that failed
        is begun again by the next call, and retried meanwhile."""
        await self._startup.wait()
        return self.epoch

    async def _start(self) -> None:
        await self.provider.initialize()
        await self.routes.start()
        await self._advertise()
        self.ready_at = time.time()

    def advert(self) -> HostAdvert:
        """What this host can run: the types its imports registered, and what failed; its
        node's labels and resources, for directors (read once: they do not change)."""
        if self._node is None:
            self._node = node_of(self.node_id)
        labels, resources = self._node
        return HostAdvert(
            labels=labels,
            resources=resources,
            name=self.name,
            node_id=self.node_id,
            job_types=default_registry.names(TypeKind.JOB),
            step_types=default_registry.names(TypeKind.STEP),
            failed_modules=self.failed_modules,
            capabilities=advertised_capabilities(),
        )

    async def _advertise(self) -> None:
        await control_store_call(lambda: write_advert(self.advert(), self.namespace))

    async def ping(self) -> int:
        return self.epoch

    async def _import_new_modules(self) -> tuple[Any, list[str]]:
        """Import the job modules added to the configuration; the configuration and failures."""
        config = await control_store_call(cluster_config, self.namespace)  # Ray's control store
        new = [m for m in config.modules if m not in self.modules]
        imported, failed = import_modules(new)
        self.modules += imported
        self.failed_modules = _by_module(failed)
        if imported and isinstance(self.provider, RemoteMemoryStorage):
            await self.provider.import_modules(imported)
        await self._advertise()
        return config, failed


def _by_module(failed: list[str]) -> dict[str, str]:
    """`import_modules`' failures ("module: reason") by module."""
    return {module: reason for module, _, reason in (f.partition(": ") for f in failed)}
