"""The membership watch on Ray: the cluster read from Ray's node table and named actors, and a
controller host wired in as the watch's participant (`recovery.watch`).

Everything here that asks Ray blocks on its control store, so it runs in a thread: the watch
reads once per `membership_interval`, never per message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import ray

from ..jobs.options import JobsOptions
from ..jobs.state import JobKey
from ..placement.roles import NodeRoles
from ..recovery.keys import KeyCatalog
from ..recovery.membership import ClusterSnapshot, NodeInfo
from ..recovery.watch import MembershipWatch
from .config import retired_nodes, taking_down
from .constants import CONTROLLER_PREFIX, host_node
from .control_calls import control_store_call
from .controller_port import ControllerPort
from .directory import actor_names, draining_nodes, host_incarnations
from .host_process import cluster_config
from .node_hosts import create_node_hosts, facts_of, roles_of

log = logging.getLogger("choreography_ray.runtime")

HOST_START_SECONDS = 120.0
"""How long the host actors of a joined node may take to start (a process each, and the job
modules to import) before the attempt counts as failed and is retried."""


class RayCluster:
    """Reads `ClusterSnapshot`s of one namespace from Ray (blocking: call it in a thread)."""

    def __init__(self, namespace: str, options: JobsOptions) -> None:
        self.namespace = namespace
        self.options = options
        self._starts: dict[str, float] = {}
        self._incarnations: dict[str, str] = {}
        """Each listed host's actor as last read alive: a host listed but not alive yet (being
        created) keeps its predecessor's until it is, so its replacement is seen."""
        self.roles: dict[str, NodeRoles] = {}
        """Each node's roles, with a worker node's step limit (its label, else the cluster's)
        and its number of worker hosts, as last read."""

    def __call__(self) -> ClusterSnapshot:
        table = ray.nodes()
        config = cluster_config(self.namespace)
        roles = {
            roles.node_id: roles
            for roles in roles_of(
                facts_of(table), self.options, config.max_parallel_steps, config.workers_per_node
            )
        }
        self.roles = roles
        if any(node["NodeID"] not in self._starts for node in table):
            self._starts.update(node_start_times())
        nodes = []
        for node in table:
            node_id = node["NodeID"]
            role = roles.get(node_id)
            nodes.append(
                NodeInfo(
                    node_id,
                    bool(node.get("Alive")),
                    f"{node.get('NodeManagerAddress', '')}:{node.get('NodeManagerPort', '')}",
                    self._starts.get(node_id),
                    controller=role is not None and role.controller,
                    worker=role is not None and role.worker,
                )
            )
        hosts = {name: host_node(name) for name in actor_names(self.namespace)}
        alive = host_incarnations(self.namespace) or {}
        self._incarnations = {
            name: actor
            for name in hosts
            if (actor := alive.get(name) or self._incarnations.get(name)) is not None
        }
        return ClusterSnapshot.of(nodes, hosts, self._incarnations, draining_nodes())


def node_start_times() -> dict[str, float]:
    """When each node started (seconds since the epoch), from the control store's node table;
    empty when it cannot be read: the election then orders nodes by address alone.

    `ray.nodes()` leaves the start out, so this reads the node table through the driver's
    control store client, which Ray does not document (see docs/decisions.md)."""
    try:
        # Set on Ray's worker when it connects; its class does not declare it.
        client = ray._private.worker.global_worker.gcs_client  # type: ignore[attr-defined]
        infos = client.get_all_node_info(timeout=10)
        return {node_id.hex(): info.start_time_ms / 1000 for node_id, info in infos.items()}
    except Exception as error:
        log.warning("the nodes' start times could not be read (%s); ordering by address", error)
        return {}


class ControllerParticipant:
    """A controller host, as its membership watch acts through it."""

    def __init__(self, host: ControllerPort, worker_class: type, cluster: RayCluster) -> None:
        self.host = host
        self.cluster = cluster
        self.name = host.name
        self.worker_class = worker_class

    def is_controller(self, name: str) -> bool:
        return name.startswith(CONTROLLER_PREFIX)

    async def hosts_lost(self, names: Mapping[str, str | None]) -> None:
        """The routing table drops them first, so the steps sent again go to live hosts
        only (a call to a host on a dead node may hang until `host_call_timeout`)."""
        for name in sorted(names):
            self.host.routes.forget(name)
        await self.host.hosts_lost(names)

    async def hosts_changed(self) -> None:
        await self.host.routes.refresh()

    async def catalog(self) -> KeyCatalog:
        if self.host.recovery.catalog is None:
            return KeyCatalog((), ("the key catalog (the host has not started)",))
        return await self.host.recovery.catalog.read()

    async def rehydrate(self, catalog: KeyCatalog) -> None:
        """Every partition: the catalog's, the configuration's and those this host serves,
        known ones again (their jobs may have lost their activation with the dead host)."""
        config = await control_store_call(cluster_config, self.host.namespace)
        keys: list[JobKey] = list(dict.fromkeys([*config.keys, *catalog.keys, *self.host.managers]))
        await self.host.recovery.partitions.recover(keys, again=True)

    async def taking_down(self) -> bool:
        return await control_store_call(taking_down, self.host.namespace)

    async def nodes_draining(self, drains: Mapping[str, float]) -> None:
        await self.host.nodes_draining(dict(drains))

    async def retired(self, node_id: str) -> bool:
        return node_id in await control_store_call(retired_nodes, self.host.namespace)

    async def start_node(self, node: NodeInfo) -> None:
        """Create the node's host actors and wait until they are ready and have read the
        configuration, as `connect` does; raises when one does not (the watch retries)."""
        read = self.cluster.roles.get(node.node_id)
        if read is None:  # not in the last reading: the cluster's figures
            config = await control_store_call(cluster_config, self.host.namespace)
            hosts = config.workers_per_node or 1
            read = NodeRoles(node.node_id, False, False, config.max_parallel_steps, hosts)
        roles = dataclasses.replace(read, controller=node.controller, worker=node.worker)
        handles: dict[str, Any] = await control_store_call(
            create_node_hosts,
            self.host.namespace,
            roles,
            controller_class=type(self.host),
            worker_class=self.worker_class,
        )
        async with asyncio.timeout(HOST_START_SECONDS):
            await asyncio.gather(*(handle.ready.remote() for handle in handles.values()))
            answers = await asyncio.gather(*(h.refresh.remote() for h in handles.values()))
        failed = sorted({failure for answer in answers for failure in answer or []})
        if failed:
            log.error("host actors of node %s could not import: %s", node.node_id, failed)
        log.warning(
            "%s: started host actor(s) %s on node %s (it joined, or a host of it was lost)",
            self.name,
            ", ".join(sorted(handles)),
            node.node_id,
        )
        await self.host.routes.refresh()


def membership_watch(host: ControllerPort, worker_class: type) -> MembershipWatch:
    """The watch of a controller host, reading Ray every `membership_interval`."""
    cluster = RayCluster(host.namespace, host.options)
    return MembershipWatch(
        ControllerParticipant(host, worker_class, cluster),
        cluster,
        host.clock,
        interval=host.options.membership_interval.total_seconds(),
        off_loop=control_store_call,
    )
