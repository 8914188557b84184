"""The provider of a cluster's storage, as a host or a reading command opens it.

Imports no Ray unless the store is `memory://`, served by an actor of the cluster: a command
that reads a database or SQLite file opens it without loading Ray.
"""

from __future__ import annotations

from ..jobs.errors import ConfigurationError
from ..jobs.options import JobsOptions
from ..storage.provider import StorageProvider
from ..storage.schemes import open_storage
from ..storage.url import StorageURL
from .config import ClusterConfig, check_same_storage, import_modules
from .packages import PackageFetch


def open_cluster_storage(
    url: str, *, namespace: str, modules: list[str], options: JobsOptions
) -> StorageProvider:
    """The provider a host uses for the cluster's storage URL."""
    parsed = StorageURL(url)
    if parsed.scheme == "memory":
        from .remote_storage import RemoteMemoryStorage

        return RemoteMemoryStorage(parsed, namespace=namespace, modules=modules, options=options)
    return open_storage(parsed, options=options)


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
