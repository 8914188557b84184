"""The console's cluster view and storage, read from a Ray cluster the process has joined.

The only console module that imports Ray. It reads what the command line reads: the cluster's
configuration (storage URL, job modules) from Ray's key-value store, the nodes from Ray, and
each host's figures from the host itself, every call bounded.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import ray

from ..jobs.options import JobsOptions
from ..jobs.registry import default_registry
from ..runtime.cluster_storage import storage_of
from ..runtime.config import (
    ClusterConfig,
    read_config,
    require_config,
)
from ..runtime.constants import CONTROLLER_PREFIX, WORKER_PREFIX
from ..runtime.directory import actor_names
from ..runtime.node_hosts import facts_of, roles_of
from ..runtime.packages import fetch_joined
from ..storage.provider import StorageProvider
from .ports import ClusterSnapshot, HostView, NodeView, StepRates

HOST_ANSWER_SECONDS = 2.0
"""How long the cluster page waits for one host's figures before it shows the host without."""
DASHBOARD_SECONDS = 1.0
"""How long the cluster page waits for Ray's dashboard to answer before it links none."""
_HIDDEN_LABELS = ("ray.io/",)
"""Labels Ray sets on every node by itself (its id and the like): not shown."""


def cluster_storage(
    namespace: str, storage: str | None = None
) -> tuple[StorageProvider, ClusterConfig]:
    """The provider of the cluster's storage, with the cluster's job modules imported so their
    records read; `storage`, when given, must be the cluster's own."""
    config = require_config(namespace)
    return storage_of(config, namespace, storage, fetch_joined), config


class RayClusterView:
    """Nodes, roles and hosts of the job system in Ray namespace `namespace`."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.rates = StepRates()

    async def snapshot(self) -> ClusterSnapshot:
        nodes, names, config = await asyncio.to_thread(self._read)
        dashboard = await asyncio.to_thread(reachable_dashboard)
        figures = await asyncio.gather(*(self._figures(name, dashboard) for name in names))
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
                    memory_bytes=float(node.get("Resources", {}).get("memory", 0)),
                    labels={
                        str(k): str(v)
                        for k, v in (node.get("Labels") or {}).items()
                        if not str(k).startswith(_HIDDEN_LABELS)
                    },
                    logs_url=f"{dashboard}/#/cluster/nodes/{node_id}" if dashboard else "",
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

    async def _figures(self, name: str, dashboard: str) -> HostView:
        role = "controller" if name.startswith(CONTROLLER_PREFIX) else "worker"
        logs = ""
        try:
            handle: Any = ray.get_actor(name, namespace=self.namespace)
            if dashboard:
                logs = f"{dashboard}/#/actors/{handle._actor_id.hex()}"
            stats = await asyncio.wait_for(
                asyncio.wrap_future(handle.stats.remote().future()), HOST_ANSWER_SECONDS
            )
        except TimeoutError:
            problem = f"no answer within {HOST_ANSWER_SECONDS:g} s"
            return HostView(name, role, problem=problem, logs_url=logs)
        except Exception as error:
            problem = f"unreachable: {type(error).__name__}"
            return HostView(name, role, problem=problem, logs_url=logs)
        done = stats.get("runs_done")
        rate = self.rates.rate(name, time.monotonic(), done) if isinstance(done, int) else None
        return HostView(
            name,
            role,
            active_runs=stats.get("active_runs"),
            max_parallel_steps=stats.get("max_parallel_steps"),
            live_jobs=stats.get("live_jobs"),
            steps_per_second=rate,
            logs_url=logs,
        )


def reachable_dashboard() -> str:
    """The URL of Ray's dashboard when it answers within `DASHBOARD_SECONDS`, else "". A
    dashboard that asks for Ray's token (401, 403) answers: the operator's browser holds the
    token; the console does not need it."""
    import urllib.error
    import urllib.request

    try:
        address = ray._private.worker.get_dashboard_url()
    except Exception:
        return ""
    if not address:
        return ""
    base = address if "://" in address else f"http://{address}"
    try:
        with urllib.request.urlopen(f"{base}/api/version", timeout=DASHBOARD_SECONDS):
            return base
    except urllib.error.HTTPError as error:
        return base if error.code in (401, 403) else ""
    except Exception:
        return ""
