"""How the commands that only read reach the cluster's storage: `jobs list`, `jobs show`,
`jobs steps` and `status`.

They read jobs and steps from storage, as the console does, and ask nothing of the controller
hosts (a host busy with a large job answers late). Of the cluster they need its configuration
and the hosts' advertisements, which lie in Ray's control store: a command reads them there
directly, in milliseconds, rather than joining the cluster as a driver (seconds). It joins
when it must: `status` calls the hosts, a `memory://` store is served by an actor, a Ray Client
address or no address has no control store to read, and a process that has joined already
reads through its connection.

`--address none` reads a store on this machine (or a server) with no Ray at all: the demo's
store by default, with the demo's job types known, so that right after `choreography demo`
its jobs can be listed with nothing running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..jobs.errors import ConfigurationError
from .common import guard, no_cluster, ray_address

T = TypeVar("T")


@dataclass
class ClusterReading:
    """What a reading command knows of the cluster besides its storage."""

    config: Any
    """The cluster's configuration (`ClusterConfig`); None for a store read without one."""
    adverts: Callable[[], dict[str, Any]]
    """The hosts' advertisements (`HostAdvert`), by host name, read when asked."""


def read_cluster(
    storage: str | None,
    address: str | None,
    work: Callable[[Any, ClusterReading], Awaitable[T]],
    *,
    join: bool = False,
) -> T:
    """`work(reader, cluster)` over the cluster's storage, opened and closed around it; `join`
    when the work calls the hosts."""
    from ..console.reader import JobsReader
    from ..runtime.constants import NAMESPACE

    def joined() -> tuple[Any, ClusterReading]:
        from ..console.ray_cluster import cluster_storage
        from ..runtime.adverts import read_adverts
        from ..runtime.connection import init_ray
        from ..runtime.directory import actor_names

        init_ray(ray_address(address), NAMESPACE)
        provider, config = cluster_storage(NAMESPACE, storage)
        return provider, ClusterReading(
            config, lambda: read_adverts(NAMESPACE, actor_names(NAMESPACE))
        )

    def local() -> tuple[Any, ClusterReading]:
        from .. import demo
        from ..jobs.registry import default_registry
        from ..runtime.config import DEFAULT_STORAGE
        from ..storage import open_storage

        url = storage or DEFAULT_STORAGE
        if url.startswith("memory:"):
            raise ConfigurationError(
                "--address none reads a store without a cluster, and a memory:// store lives "
                "only in its cluster: give --storage of a file or server, or the cluster's "
                "--address"
            )
        assert demo.DemoJob.name in default_registry.names("job")  # its types read
        return open_storage(url, registry=default_registry), ClusterReading(None, dict)

    def opened() -> tuple[Any, ClusterReading]:
        if no_cluster(address) and not join:
            return local()  # imports no Ray
        from ..console.ray_cluster import storage_of
        from ..runtime.control_store import reach

        store = None if join else reach(address)
        if store is None:
            return joined()
        config = store.config(NAMESPACE)
        if config.storage.startswith("memory:"):
            return joined()  # served by an actor of the cluster
        provider = storage_of(config, NAMESPACE, storage, store.package)
        return provider, ClusterReading(config, lambda: store.adverts(NAMESPACE))

    def run() -> T:
        provider, cluster = opened()

        async def reading() -> T:
            await provider.initialize()
            try:
                return await work(JobsReader(provider), cluster)
            finally:
                await provider.close()

        return asyncio.run(reading())

    return guard(run)
