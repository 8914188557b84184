"""Ray's own autoscaler on one machine: a head started with `ray start --autoscaling-config`
over Ray's fake multi-node provider (`RAY_FAKE_CLUSTER=1`), which launches and terminates
worker nodes as local raylets when the autoscaler decides to.

    with FakeAutoscalingCluster.from_cluster_yaml("ray-cluster.yaml") as cluster:
        jobs = cr.connect(storage, address=cluster.address)
        ...                         # the autoscaler adds worker nodes for the job's steps
        cluster.worker_nodes()      # the live ones, as Ray lists them

The node types are a cluster file's own (resources and labels), with a CPU count of their
own (the fake provider does not read instance types), the head's renamed `ray.head.default`
(the name the provider gives its head). Everything runs under a temporary directory of its own
(`RAY_TMPDIR`): the nodes' sockets and logs, and the mark by which `shutdown` finds and kills
every process the cluster started — never another Ray of the machine, and never `ray stop`.
Ray's token authentication is off for it (`env` may say otherwise), as for a driver that sets
nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .cluster_nodes import HealthChecks
from .processes import kill_marked

HEAD_TYPE = "ray.head.default"
"""The fake provider's name for the head's node type."""


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


class FakeAutoscalingCluster:
    """A head with Ray's autoscaler over the fake multi-node provider, and its worker nodes."""

    def __init__(
        self,
        head: Mapping[str, Any],
        workers: Mapping[str, Mapping[str, Any]],
        *,
        idle_timeout_minutes: float = 0.25,
        health: HealthChecks | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`head` and `workers` are node types as a cluster file writes them (`resources`,
        `labels`, and for workers `min_workers`/`max_workers`); each needs a CPU resource."""
        self.head = dict(head)
        self.workers = {name: dict(spec) for name, spec in workers.items()}
        self.idle_timeout_minutes = idle_timeout_minutes
        self.health = health or HealthChecks()
        self.env = dict(env or {})
        self.port = 0
        self.tmp: Path | None = None
        self.address = ""

    @classmethod
    def from_cluster_yaml(
        cls,
        path: str | Path,
        *,
        cpus: int = 1,
        max_workers: int | None = None,
        **kwargs: Any,
    ) -> FakeAutoscalingCluster:
        """The node types of a `ray up` cluster file, each with `cpus` CPUs (and at most
        `max_workers` nodes of each worker type, when given)."""
        config = yaml.safe_load(Path(path).read_text())
        types = dict(config["available_node_types"])
        head = dict(types.pop(config["head_node_type"]))
        head.setdefault("resources", {})["CPU"] = cpus
        workers = {}
        for name, spec in types.items():
            worker = dict(spec)
            worker["resources"] = {**worker.get("resources", {}), "CPU": cpus}
            if max_workers is not None:
                worker["max_workers"] = min(worker.get("max_workers", max_workers), max_workers)
            workers[name] = worker
        return cls(head, workers, **kwargs)

    # -- life cycle ---------------------------------------------------------------------------

    def config(self, gcs_address: str) -> dict[str, Any]:
        """The autoscaling config the head's monitor reads."""
        types: dict[str, Any] = {
            HEAD_TYPE: {
                "resources": self.head.get("resources", {}),
                "labels": self.head.get("labels", {}),
                "node_config": {},
                "max_workers": 0,
            }
        }
        for name, spec in self.workers.items():
            types[name] = {
                "resources": spec.get("resources", {}),
                "labels": spec.get("labels", {}),
                "node_config": {},
                "min_workers": spec.get("min_workers", 0),
                "max_workers": spec.get("max_workers", 1),
            }
        return {
            "cluster_name": "choreography-fake",
            "max_workers": sum(t.get("max_workers", 0) for t in types.values()),
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": self.idle_timeout_minutes,
            # One node per node the autoscaler launches (by default the fake provider makes
            # one per call whatever the count); no updater runs setup commands on the nodes
            # (it could not tag them: the provider is read-only, and the node "failed").
            "provider": {
                "type": "fake_multinode",
                "gcs_address": gcs_address,
                "launch_multiple": True,
                "use_node_id_as_ip": True,
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
            },
            "auth": {"ssh_user": "ray"},
            "available_node_types": types,
            "head_node_type": HEAD_TYPE,
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "rsync_exclude": [],
            "rsync_filter": [],
            "initialization_commands": [],
            "setup_commands": [],
            "head_setup_commands": [],
            "worker_setup_commands": [],
            "head_start_ray_commands": [],
            "worker_start_ray_commands": [],
        }

    def start(self) -> str:
        """Start the head (its monitor runs the autoscaler); returns its address."""
        import ray._private.services

        # Short: Ray's socket paths under it must stay below 107 characters.
        self.tmp = Path(tempfile.mkdtemp(prefix="crfake-"))
        self.port = _free_port()
        self.address = f"{ray._private.services.get_node_ip_address()}:{self.port}"
        config = self.tmp / "autoscaling.yaml"
        config.write_text(json.dumps(self.config(self.address)))
        resources = dict(self.head.get("resources", {}))
        cpus = int(resources.pop("CPU", 1))
        labels = ",".join(f"{k}={v}" for k, v in self.head.get("labels", {}).items())
        command = [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            f"--port={self.port}",
            f"--autoscaling-config={config}",
            f"--num-cpus={cpus}",
            f"--resources={json.dumps(resources)}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--system-config={json.dumps(self.health.system_config())}",
        ]
        if labels:
            command.append(f"--labels={labels}")
        env = {
            **os.environ,
            "RAY_AUTH_MODE": "disabled",  # `ray start` turns it on where a token file exists
            **self.env,
            "RAY_TMPDIR": str(self.tmp),
            "RAY_FAKE_CLUSTER": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
        }
        try:
            subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)
        except BaseException:
            self.shutdown()
            raise
        return self.address

    def shutdown(self) -> None:
        """Kill every process of the cluster (found by its temporary directory) and delete
        the directory; waits are bounded."""
        if self.tmp is None:
            return
        kill_marked(f"RAY_TMPDIR={self.tmp}".encode(), timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp = None

    def __enter__(self) -> FakeAutoscalingCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- what runs ----------------------------------------------------------------------------

    def worker_nodes(self) -> list[dict[str, Any]]:
        """The live nodes besides the head, as `ray.nodes()` lists them (the driver must be
        connected)."""
        import ray

        return [
            node
            for node in ray.nodes()
            if node.get("Alive")
            and node.get("Labels", {}).get("ray.io/node-type") != HEAD_TYPE
            and not node.get("Resources", {}).get("node:__internal_head__")
        ]
