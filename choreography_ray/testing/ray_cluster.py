"""A multi-node Ray on one machine, for tests of what the job system does when nodes and host
processes die.

Built on Ray's `ray.cluster_utils.Cluster`: every node is a raylet of its own on this machine,
declaring its role through the custom resources placement reads (`choreography_controller`,
`choreography_worker`), or, given as a `NodeSpec` with `by_label=True`, through the node label
`choreography.io/role`, with any other labels (such as `choreography.io/max-parallel-steps`).
The head starts with lowered health-check settings, so that Ray declares a killed node dead
in about a second and a half instead of about fifteen.

    with MultiNodeCluster("sqlite:///jobs.db", modules=["my_jobs"]) as cluster:
        job_id = cluster.jobs.start(MyJob, MyRequest())
        cluster.add_node("worker")          # a node joins; the hosts start its host actors
        cluster.remove_node("worker")       # SIGKILL of the last worker node's processes
        cluster.kill_host(name)             # SIGKILL of one host actor's process
        cluster.restart()                   # the whole cluster again, over the same storage
        node_id, pids = cluster.freeze_node("worker")  # SIGSTOP of its raylet: declared dead
        cluster.thaw_node(node_id)          # SIGCONT: the raylet learns it is dead and exits

With `control_store=ControlStoreOnRedis()` the head runs Ray's GCS fault tolerance on a Redis
server (a key namespace of its own, deleted on shutdown): `kill_control_store()` and
`start_control_store()` then restart the control store under a running cluster.

Faults are abrupt (SIGKILL), as real ones are. The helper kills only processes of its own
cluster, never another Ray on the machine, and keeps off Ray's "current cluster" address file,
so that a `ray.init()` elsewhere on the machine never joins this cluster.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator, Sequence
from typing import Any
from unittest import mock

import ray
import ray._common.utils
import ray._private.utils
from ray._private.ray_constants import PROCESS_TYPE_RAYLET
from ray.cluster_utils import Cluster

from ..jobs.errors import ConfigurationError
from ..jobs.options import JobsOptions
from ..runtime.client import Jobs
from ..runtime.connection import connect
from ..runtime.constants import NAMESPACE
from ..runtime.directory import actor_names
from ..storage.url import StorageURL
from .cluster_nodes import (
    ClusterNode,
    ControlStoreOnRedis,
    HealthChecks,
    NodeSpec,
    Role,
    checked_layout,
    spec_of,
    takes,
)
from .processes import POLL_SECONDS, children, parent, still_running

_EXIT_SECONDS = 10.0
"""How long a killed process, or a host actor's process after its node, may take to exit."""


class MultiNodeCluster:
    """A head and more nodes on this machine, each declaring a role, with the job system
    connected over `storage`; `nodes[0]` is the head, which the driver is attached to.

    `start()` (or entering the context) starts Ray and the hosts; `shutdown()` (or leaving
    it) stops every process the cluster started, whatever happened before.
    """

    def __init__(
        self,
        storage: str,
        *,
        nodes: Sequence[Role | NodeSpec] = ("controller", "worker", "worker"),
        namespace: str = NAMESPACE,
        modules: Sequence[str] = (),
        options: JobsOptions | None = None,
        runtime_env: dict[str, Any] | None = None,
        cpus_per_node: int = 1,
        health: HealthChecks | None = None,
        node_timeout: float = 30.0,
        allow_no_worker: bool = False,
        control_store: ControlStoreOnRedis | None = None,
    ) -> None:
        self.storage = _durable_storage(storage)
        self.layout: tuple[NodeSpec, ...] = checked_layout(nodes, allow_no_worker)
        self.namespace = namespace
        self.modules = list(modules)
        self.options = options
        self.runtime_env = runtime_env
        self.cpus_per_node = cpus_per_node
        self.health = health or HealthChecks()
        self.node_timeout = node_timeout
        self._cluster: Cluster | None = None
        self._nodes: dict[str, tuple[ClusterNode, Any]] = {}
        self._removed_at: dict[str, float] = {}
        self._jobs: Jobs | None = None
        self.control_store = control_store
        self._saved_env: dict[str, str | None] = {}
        self._frozen: dict[str, int] = {}
        """Raylet process of each frozen node, by node id."""

    # -- life cycle -------------------------------------------------------------------------

    def __enter__(self) -> MultiNodeCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def start(self) -> Jobs:
        """Start the nodes of the layout and connect the job system; returns its client."""
        if self._cluster is not None:
            raise RuntimeError("this cluster is running already")
        if ray.is_initialized():
            raise RuntimeError("this process is connected to a Ray already (ray.shutdown() it)")
        try:
            self._start_nodes()
            self._jobs = connect(
                self.storage,
                address=self.address,
                namespace=self.namespace,
                options=self.options,
                modules=self.modules,
                runtime_env=self.runtime_env,
            )
        except BaseException:
            self.shutdown()
            raise
        return self._jobs

    def restart(self) -> Jobs:
        """Shut the whole cluster down and start it again with the same layout, over the same
        storage: a whole-cluster restart, as after a power cut. Node ids change."""
        self.shutdown()
        return self.start()

    def shutdown(self) -> None:
        """Stop the driver's Ray and every process of the cluster; waits are bounded, and every
        part runs even when an earlier one failed."""
        cluster, self._cluster = self._cluster, None
        self._jobs = None
        if cluster is None:
            return
        raylets = self.process_ids(PROCESS_TYPE_RAYLET)
        workers = children(*raylets)
        with contextlib.suppress(Exception):
            ray.shutdown()
        for pid in raylets:  # stopped, a raylet starts no worker that the list below misses
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        workers |= children(*raylets)
        with _ray_address_file_untouched():
            for node in [*cluster.worker_nodes]:
                with contextlib.suppress(Exception):
                    cluster.remove_node(node, allow_graceful=False)
            if cluster.head_node is not None:
                with contextlib.suppress(Exception):
                    cluster.remove_node(cluster.head_node, allow_graceful=False)
            with contextlib.suppress(Exception):
                cluster.shutdown()  # resets what Ray keeps of it in this process
        # The worker processes go with their nodes (some take seconds to notice on their own).
        for pid in [*workers, *self._frozen.values()]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        still_running(workers, _EXIT_SECONDS)
        self._nodes.clear()
        self._removed_at.clear()
        self._frozen.clear()
        self._forget_control_store()

    def _forget_control_store(self) -> None:
        """Delete the control store's keys from Redis and put the environment back."""
        if self.control_store is None or not self._saved_env:
            return
        from ray._private.gcs_utils import cleanup_redis_storage

        host, _, port = self.control_store.redis.rpartition(":")
        with contextlib.suppress(Exception):
            cleanup_redis_storage(host, int(port), "", False, self.control_store.namespace)
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env = {}

    def _start_nodes(self) -> None:
        if self.control_store is not None:
            # The head's processes (and a control store started again later) read it from
            # their environment, inherited from this process.
            for name, value in self.control_store.env().items():
                self._saved_env.setdefault(name, os.environ.get(name))
                os.environ[name] = value
        with _ray_address_file_untouched():
            self._cluster = Cluster(shutdown_at_exit=True)
            for index, spec in enumerate(self.layout):
                self._add(spec, head=index == 0)
            self._cluster.wait_for_nodes(timeout=self.node_timeout)

    def _add(self, spec: NodeSpec, *, head: bool) -> ClusterNode:
        assert self._cluster is not None
        args: dict[str, Any] = {"num_cpus": self.cpus_per_node, **spec.node_args()}
        if head:
            args["include_dashboard"] = False
            args["_system_config"] = self.health.system_config()
        node = self._cluster.add_node(wait=True, **args)
        added = ClusterNode(node.node_id, spec.role, head)
        self._nodes[node.node_id] = (added, node)
        return added

    def add_node(self, node: Role | NodeSpec) -> ClusterNode:
        """Start one more node, as a machine that joins, and wait until Ray lists it. Its
        hosts are not started here: the controller hosts' membership watch starts them within
        `membership_interval` (or `start_hosts()` does at once). A `restart()` starts the
        layout alone."""
        if self._cluster is None:
            raise RuntimeError("the cluster is not running (start() it)")
        spec = spec_of(node)
        with _ray_address_file_untouched():
            added = self._add(spec, head=False)
            self._cluster.wait_for_nodes(timeout=self.node_timeout)
        return added

    def start_hosts(self) -> list[str]:
        """Start the host actors of nodes that have none yet (those added since); returns
        every host's name."""
        from ..runtime.placement import start_hosts

        return sorted(start_hosts(self.namespace))

    # -- what runs --------------------------------------------------------------------------

    @property
    def jobs(self) -> Jobs:
        if self._jobs is None:
            raise RuntimeError("the cluster is not running (start() it)")
        return self._jobs

    @property
    def address(self) -> str:
        if self._cluster is None or self._cluster.address is None:
            raise RuntimeError("the cluster is not running (start() it)")
        return str(self._cluster.address)

    def nodes(self, role: Role | None = None) -> list[ClusterNode]:
        """The nodes started and not removed, in the layout's order; with `role`, those that
        declare it ("both" counts as either)."""
        found = [node for node, _ in self._nodes.values()]
        if role is None:
            return found
        return [node for node in found if takes(node.role, role)]

    def host_names(self) -> list[str]:
        """The host actors of the job system that Ray lists now, by name."""
        return actor_names(self.namespace)

    def process_ids(self, kind: str | None = None) -> list[int]:
        """The Ray processes of every node not removed (control store, raylet, agents); with
        `kind`, those of one kind ("raylet", "gcs_server"). Worker processes are not listed."""
        return [
            info.process.pid
            for _, node in self._nodes.values()
            for found, infos in node.all_processes.items()
            if kind is None or found == kind
            for info in infos
        ]

    # -- faults -----------------------------------------------------------------------------

    def remove_node(self, which: str) -> str:
        """Kill every process of a node at once (SIGKILL), as a machine that dies; returns its
        node id once they are gone. `which` is a node id, or a role: the last node that declares
        it. The head, which the driver is attached to, cannot be removed."""
        described, node = self._entry(which)
        assert self._cluster is not None
        workers = children(node.all_processes[PROCESS_TYPE_RAYLET][0].process.pid)
        self._cluster.remove_node(node, allow_graceful=False)
        # The node's worker processes (its host actors) die with it, as on a lost machine; the
        # raylet goes first, so Ray learns of a dead node rather than of dead actors.
        for pid in workers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if still_running(workers, _EXIT_SECONDS):
            raise TimeoutError(f"processes of node {described.node_id} outlived their SIGKILL")
        self._removed_at[described.node_id] = time.monotonic()
        del self._nodes[described.node_id]
        return described.node_id

    def freeze_node(self, which: str) -> tuple[str, set[int]]:
        """Stop a node's raylet (SIGSTOP), as a machine that hangs or is cut off: Ray declares
        the node dead while its other processes run on. Returns its node id and the worker
        processes (its host actors among them) that were running on it. `which`: a node id or
        a role (the last node that declares it; never the head)."""
        described, node = self._entry(which)
        raylet = node.all_processes[PROCESS_TYPE_RAYLET][0].process.pid
        workers = children(raylet)
        os.kill(raylet, signal.SIGSTOP)
        self._frozen[described.node_id] = raylet
        self._removed_at[described.node_id] = time.monotonic()
        return described.node_id, workers

    def thaw_node(self, node_id: str) -> None:
        """Let a frozen node's raylet run again (SIGCONT): declared dead meanwhile, it exits;
        the node counts as removed."""
        raylet = self._frozen.pop(node_id)
        os.kill(raylet, signal.SIGCONT)
        if still_running({raylet}, 30):
            os.kill(raylet, signal.SIGKILL)
        entry = self._nodes.pop(node_id, None)
        if entry is not None and self._cluster is not None:
            with _ray_address_file_untouched(), contextlib.suppress(Exception):
                self._cluster.remove_node(entry[1], allow_graceful=False)  # its other processes

    def kill_control_store(self) -> None:
        """Kill the head's control store (its GCS server), as a head process that crashes."""
        assert self._cluster is not None and self._cluster.head_node is not None
        self._cluster.head_node.kill_gcs_server()

    def start_control_store(self) -> None:
        """Start the control store again, on its port; with `control_store` on Redis it reads
        its tables back and the cluster carries on."""
        assert self._cluster is not None and self._cluster.head_node is not None
        with _ray_address_file_untouched():
            self._cluster.head_node.start_gcs_server()

    def _entry(self, which: str) -> tuple[ClusterNode, Any]:
        """The node `which` names: a node id, or a role (the last node besides the head
        that declares it)."""
        entry = self._nodes.get(which)
        if entry is None:
            candidates = [
                node
                for node, _ in self._nodes.values()
                if not node.head and takes(node.role, which) and node.node_id not in self._frozen
            ]
            if not candidates:
                raise ValueError(
                    f"no node for {which!r}: neither a node id of this cluster nor a role "
                    "that a node besides the head declares"
                )
            entry = self._nodes[candidates[-1].node_id]
        if entry[0].head:
            raise ValueError("the head node cannot be removed: the driver is attached to it")
        return entry

    def wait_node_dead(self, node_id: str, timeout: float | None = None) -> float:
        """Wait until Ray declares a removed node dead; returns the seconds from its removal.
        Raises TimeoutError after `timeout` (three detection times and 5 s, by default)."""
        removed = self._removed_at.get(node_id)
        if removed is None:
            raise ValueError(f"node {node_id} was not removed by this cluster")
        bound = timeout if timeout is not None else 3 * self.health.detection_seconds + 5
        deadline = removed + bound
        while True:
            if not any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes()):
                return time.monotonic() - removed
            if time.monotonic() >= deadline:
                raise TimeoutError(f"Ray did not declare node {node_id} dead within {bound} s")
            time.sleep(POLL_SECONDS)

    def host_pid(self, name: str) -> int:
        """The process id of the live host actor `name`, from Ray's actor table."""
        try:
            handle = ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            raise ValueError(
                f"no live actor named {name!r} in Ray namespace {self.namespace!r}"
            ) from None
        assert self._cluster is not None
        entry = self._cluster.global_state.actor_table(handle._actor_id.hex())
        if not entry or entry.get("State") != "ALIVE" or not entry.get("Pid"):
            raise ValueError(f"actor {name!r} has no live process")
        return int(entry["Pid"])

    def kill_host(self, name: str) -> int:
        """SIGKILL the process of host actor `name`, as a crash of that process alone (its
        node lives); returns the process id, once the process is gone."""
        pid = self.host_pid(name)
        self._kill(pid)
        if still_running({pid}, _EXIT_SECONDS):
            raise TimeoutError(f"process {pid} of {name!r} did not exit within {_EXIT_SECONDS} s")
        return pid

    def _kill(self, pid: int) -> None:
        """SIGKILL `pid` if it is a process of this cluster (a child of one of its raylets),
        never anything else on the machine."""
        if parent(pid) not in self.process_ids(PROCESS_TYPE_RAYLET):
            raise ValueError(f"process {pid} is not a worker process of this cluster")
        os.kill(pid, signal.SIGKILL)


def _durable_storage(storage: str) -> str:
    url = StorageURL(storage)
    if url.scheme == "memory":
        raise ConfigurationError(
            f"storage {url.redacted}: memory:// lives in a Ray actor and does not outlive the "
            "cluster; a restart needs storage outside Ray (sqlite:///..., postgresql://...)"
        )
    return storage


@contextlib.contextmanager
def _ray_address_file_untouched() -> Iterator[None]:
    """Keep `Cluster` off Ray's "current cluster" file (`/tmp/ray/ray_current_cluster`): it
    writes its head's address there, and for as long as the file names this cluster, a plain
    `ray.init()` anywhere on the machine joins it instead of starting its own Ray; its shutdown
    deletes the file, whoever wrote it. Nothing here reads the file: the driver joins by
    address."""
    with (
        mock.patch.object(ray._private.utils, "write_ray_address", lambda *args, **kw: None),
        mock.patch.object(ray._common.utils, "reset_ray_address", lambda *args, **kw: None),
    ):
        yield
