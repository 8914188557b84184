"""The cluster-wide configuration: written once, read by every host, so all hosts agree.

It lives in Ray's internal key-value store (in the GCS), which every driver and actor of the
cluster reaches and which lives as long as the cluster.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from ..jobs.errors import ConfigurationError
from ..jobs.options import JobsOptions
from ..jobs.state import JobKey
from .constants import CONFIG_KEY, DOWN_KEY
from .packages import PackageFetch, use_packages

log = logging.getLogger("choreography_ray.runtime")

DEFAULT_STORAGE = "sqlite:///.choreography/jobs.db"
"""The storage of a cluster whose first `connect` names none."""


class ClusterConfig(BaseModel):
    storage: str
    """The storage URL every host opens."""
    options: dict[str, Any] = Field(default_factory=dict)
    """JobsOptions settings that differ from the defaults."""
    modules: list[str] = Field(default_factory=list)
    """Modules every host imports, so job and step types resolve by name."""
    packages: dict[str, list[str]] = Field(default_factory=dict)
    """By module: the `gcs://` packages of the runtime env of the process that named it (a
    `ray job submit --working-dir`), where a process that lacks the module imports it from."""
    keys: list[JobKey] = Field(default_factory=list)
    """Every (scope, namespace) a client has used: the partitions hosts recover."""
    max_parallel_steps: int | None = None
    workers_per_node: int | None = None
    """How the first `connect` placed worker hosts: a node that joins later gets the same.
    None (not given): each worker node runs one per CPU of its own, within bounds
    (`engine.limits.worker_hosts`). The previous release always wrote a number (1 unless
    given), which reads as given: a cluster it configured keeps its placement."""

    def jobs_options(self) -> JobsOptions:
        return JobsOptions.from_mapping(self.options)


def _kv() -> Any:
    from ray.experimental import internal_kv

    return internal_kv


def read_config(namespace: str) -> ClusterConfig | None:
    raw = _kv()._internal_kv_get(CONFIG_KEY, namespace=namespace)
    if raw is None:
        return None
    return ClusterConfig.model_validate_json(raw)


def require_config(namespace: str) -> ClusterConfig:
    """The configuration, which must be there: a `ConfigurationError` naming what to do when
    the namespace has none (callers that mean something else by it map the error)."""
    config = read_config(namespace)
    if config is None:
        raise missing_config(namespace)
    return config


def missing_config(namespace: str) -> ConfigurationError:
    """The error of a namespace with no configuration: what to run to give it one."""
    return ConfigurationError(
        f"no choreography configuration in Ray namespace {namespace!r}; start hosts with "
        "choreography_ray.connect(...) or `choreography up`"
    )


def config_json(config: ClusterConfig) -> str:
    """The configuration as stored. An unset `workers_per_node` is left out rather than
    written as null: a host of the previous release, during a rolling upgrade, reads the field
    as a number and would refuse null; it reads the missing field as its old default, 1."""
    unset = {"workers_per_node"} if config.workers_per_node is None else None
    return config.model_dump_json(exclude=unset)


def write_config(config: ClusterConfig, namespace: str) -> None:
    _kv()._internal_kv_put(
        CONFIG_KEY, config_json(config).encode(), overwrite=True, namespace=namespace
    )


def restore_config(previous: ClusterConfig | None, namespace: str) -> None:
    """Put back the configuration a failed `connect` replaced: none, if there was none."""
    if previous is None:
        _kv()._internal_kv_del(CONFIG_KEY, namespace=namespace)
    else:
        write_config(previous, namespace)


def mark_taking_down(namespace: str, down: bool = True) -> None:
    """Mark the namespace's hosts as being stopped (`down`), or clear the mark (`up`): while
    it is set, no controller host starts the host actors of a node, so a host that `down`
    stops is never started again behind it."""
    if down:
        _kv()._internal_kv_put(DOWN_KEY, b"down", overwrite=True, namespace=namespace)
    else:
        _kv()._internal_kv_del(DOWN_KEY, namespace=namespace)


def taking_down(namespace: str) -> bool:
    """Whether `down` stopped, or is stopping, the namespace's hosts (a blocking read)."""
    return bool(_kv()._internal_kv_exists(DOWN_KEY, namespace=namespace))


RETIRED_PREFIX = b"choreography_ray:retired:"


def mark_retired(namespace: str, node_id: str, retired: bool = True) -> None:
    """Mark a worker node whose hosts left it, idle, so that Ray's autoscaler can remove it
    (no controller host starts them again), or clear the mark (blocking)."""
    key = RETIRED_PREFIX + node_id.encode()
    if retired:
        _kv()._internal_kv_put(key, b"retired", overwrite=True, namespace=namespace)
    else:
        _kv()._internal_kv_del(key, namespace=namespace)


def retired_nodes(namespace: str) -> set[str]:
    """The worker nodes marked retired (a blocking read)."""
    keys = _kv()._internal_kv_list(RETIRED_PREFIX, namespace=namespace) or []
    return {bytes(key)[len(RETIRED_PREFIX) :].decode() for key in keys}


def import_modules(
    modules: list[str],
    *,
    packages: Mapping[str, list[str]] | None = None,
    fetch: PackageFetch | None = None,
    quiet: bool = False,
) -> tuple[list[str], list[str]]:
    """Import the modules that define job types: the ones imported, and the failures (each
    "module: reason"). A module this process does not have is imported from its `packages`
    when `fetch` reaches them; `quiet` leaves the failures to the caller to tell."""
    imported, failed = [], []
    for name in modules:
        try:
            _import(name, (packages or {}).get(name, []), fetch)
            imported.append(name)
        except Exception as error:
            if not quiet:
                log.error("could not import job module %r: %s", name, error)
            failed.append(f"{name}: {type(error).__name__}: {error}")
    return imported, failed


def _import(name: str, packages: list[str], fetch: PackageFetch | None) -> None:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as error:
        if not packages or fetch is None:
            raise
        gone = use_packages(packages, fetch)
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            if not gone:
                raise
            raise ModuleNotFoundError(
                f"{error}, and the Ray cluster no longer holds the package it was submitted "
                f"with ({', '.join(gone)}): install it here, or put it on PYTHONPATH",
                name=error.name,
            ) from None


def merge(
    config: ClusterConfig,
    *,
    modules: list[str],
    keys: list[JobKey],
    packages: list[str] | None = None,
) -> ClusterConfig:
    """`config` with `modules` and `keys` added, and `packages` recorded as where each of
    `modules` comes from; `config` itself when nothing changes."""
    new_modules = [m for m in modules if m not in config.modules]
    new_keys = [k for k in keys if k not in config.keys]
    moved = {m: packages for m in modules if packages and config.packages.get(m) != packages}
    if not new_modules and not new_keys and not moved:
        return config
    return config.model_copy(
        update={
            "modules": [*config.modules, *new_modules],
            "keys": [*config.keys, *new_keys],
            "packages": {**config.packages, **moved},
        }
    )


def check_same_storage(config: ClusterConfig, storage: str | None) -> None:
    if storage is not None and storage != config.storage:
        from ..storage.url import redact

        raise ConfigurationError(
            f"this Ray cluster's job system already uses storage {redact(config.storage)!r}; "
            f"it cannot also use {redact(storage)!r} (connect without storage=, or use another "
            "namespace)"
        )
