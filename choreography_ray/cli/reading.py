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
store by default, with the demo's job types known and those of the modules named by
`--module`, so that right after `choreography demo` its jobs can be listed, shown, followed
and their results read with nothing running.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..jobs.errors import ConfigurationError
from .common import NO_CLUSTER, guard, no_cluster, ray_address

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
    modules: list[str] | None = None,
) -> T:
    """`work(reader, cluster)` over the cluster's storage, opened and closed around it; `join`
    when the work calls the hosts. `modules` are imported first, so that the records of
    their job types read (a cluster's own job modules are imported anyway)."""
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
        return open_storage(url, registry=default_registry), ClusterReading(None, dict)

    def opened() -> tuple[Any, ClusterReading]:
        if no_cluster(address) and not join:
            imported(["choreography_ray.demo", *(modules or [])])  # the demo's types read
            return local()  # imports no Ray
        imported(modules or [])
        from ..runtime.cluster_storage import storage_of
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


def imported(modules: list[str]) -> None:
    """Import `modules`, which define job types; one that does not import is a usage error
    (exit 2) naming it and why."""
    from ..runtime.config import import_modules

    _, failed = import_modules(modules, quiet=True)
    if failed:
        raise ConfigurationError(f"cannot import job modules: {'; '.join(failed)}")


def watch_in_storage(
    storage: str | None, key: Any, job_id: str, within: float | None, modules: list[str] | None
) -> Any:
    """`jobs watch --address none`: the job's state once it is finished, followed in storage
    (there is no cluster to ask)."""

    async def work(reader: Any, _: ClusterReading) -> Any:
        return await follow(reader, key, job_id, within)

    return read_cluster(storage, NO_CLUSTER, work, modules=modules)


async def follow(
    reader: Any, key: Any, job_id: str, within: float | None, interval: float = 0.5
) -> Any:
    """The job's state once it is finished, read from storage every `interval` seconds with
    a progress bar meanwhile. Raises TimeoutError when it is not finished `within` seconds;
    a job that was there and is gone is None."""
    from ..jobs.errors import JobNotFoundError
    from ..runtime.progress import ProgressBar

    deadline = None if within is None else time.monotonic() + within
    whole = (await reader.job(key, job_id)).id  # not there: exit 3; a prefix names its job
    with ProgressBar() as bar:
        while True:
            try:
                state = await reader.job(key, whole)
            except JobNotFoundError:
                return None  # removed, or cleared as it completed
            bar.update(state)
            if state.is_finished:
                return state
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {whole} did not finish within {within:g} s")
            await asyncio.sleep(interval)
