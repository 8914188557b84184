"""The nodes of a multi-node test cluster: the role each declares (by custom resource or by the
role label), its labels, and how quickly Ray declares a killed node dead. Plain values: they
import neither Ray nor the runtime."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..jobs.errors import ConfigurationError
from ..placement.roles import CONTROLLER_RESOURCE, ROLE_LABEL, WORKER_RESOURCE

Role = Literal["controller", "worker", "both", "none"]

_RESOURCES: dict[str, dict[str, float]] = {
    "controller": {CONTROLLER_RESOURCE: 1},
    "worker": {WORKER_RESOURCE: 1},
    "both": {CONTROLLER_RESOURCE: 1, WORKER_RESOURCE: 1},
    "none": {},
}


@dataclass(frozen=True)
class HealthChecks:
    """How quickly Ray's control store declares a node dead: it checks every node's raylet
    each `period_ms`, a check failing after `timeout_ms`, and declares the node dead after
    `failure_threshold` failed checks in a row. Ray's own defaults (3 s, 10 s, 5) take about
    15 s for a killed node; these take about 1.5 s."""

    period_ms: int = 500
    timeout_ms: int = 500
    failure_threshold: int = 3

    def system_config(self) -> dict[str, int]:
        """The head node's `_system_config` (`ray start --system-config` takes the same keys)."""
        return {
            "health_check_period_ms": self.period_ms,
            "health_check_timeout_ms": self.timeout_ms,
            "health_check_failure_threshold": self.failure_threshold,
        }

    @property
    def detection_seconds(self) -> float:
        """The longest Ray should take to declare a killed node dead."""
        return (self.period_ms * self.failure_threshold + self.timeout_ms) / 1000


@dataclass(frozen=True)
class ControlStoreOnRedis:
    """Ray's GCS fault tolerance: the head's control store keeps its tables in Redis, under a
    key namespace of its own, so a control store killed and started again reads them back,
    while running actors and their calls carry on. `reconnect_seconds` is how long raylets and
    workers wait for it to come back before they give up and exit: Ray's
    `gcs_rpc_server_reconnect_timeout_s` (60 s by default), read from every node's
    environment (set in the head's system config only, raylets still exited after 60 s)."""

    redis: str = "127.0.0.1:6379"
    namespace: str = field(default_factory=lambda: f"choreography-test-{uuid.uuid4().hex[:12]}")
    reconnect_seconds: int = 120

    def env(self) -> dict[str, str]:
        """The environment Ray's processes read it from (the head's the first two)."""
        return {
            "RAY_REDIS_ADDRESS": self.redis,
            "RAY_external_storage_namespace": self.namespace,
            "RAY_gcs_rpc_server_reconnect_timeout_s": str(self.reconnect_seconds),
        }


@dataclass(frozen=True)
class NodeSpec:
    """A node to start: its role, declared by custom resource or (`by_label`) by the role
    label, and more node labels."""

    role: Role
    labels: Mapping[str, str] = field(default_factory=dict)
    by_label: bool = False
    env_vars: Mapping[str, str] = field(default_factory=dict)
    """Environment of the node's processes, its host actors' among them (for instance
    `CHOREOGRAPHY_WITHHELD_CAPABILITIES`, to play a host of an older release)."""

    def node_args(self) -> dict[str, Any]:
        """`Cluster.add_node`'s arguments that declare the role and the labels."""
        labels = dict(self.labels)
        resources: dict[str, float] = {}
        if self.by_label and self.role != "none":
            labels[ROLE_LABEL] = self.role
        else:
            resources = dict(_RESOURCES[self.role])
        args: dict[str, Any] = {"resources": resources, "labels": labels}
        if self.env_vars:
            args["env_vars"] = dict(self.env_vars)
        return args


@dataclass(frozen=True)
class ClusterNode:
    """A node of the cluster as started: its Ray node id and the role it declares."""

    node_id: str
    role: Role
    head: bool


def takes(declared: Role, wanted: str) -> bool:
    """Whether a node that declares `declared` takes the role `wanted`."""
    return wanted == declared or (declared == "both" and wanted in ("controller", "worker"))


def spec_of(node: object) -> NodeSpec:
    spec = node if isinstance(node, NodeSpec) else NodeSpec(node)  # type: ignore[arg-type]
    if spec.role not in _RESOURCES:
        raise ConfigurationError(
            f"nodes: unknown role {spec.role!r} (expected one of {', '.join(_RESOURCES)})"
        )
    return spec


def checked_layout(nodes: Sequence[object], allow_no_worker: bool = False) -> tuple[NodeSpec, ...]:
    layout = tuple(spec_of(node) for node in nodes)
    roles = [spec.role for spec in layout]
    if not any(role in ("controller", "both") for role in roles):
        raise ConfigurationError(f"nodes: {roles} has no controller node")
    if not allow_no_worker and not any(role in ("worker", "both") for role in roles):
        raise ConfigurationError(f"nodes: {roles} has no worker node")
    return layout


def drain_node(
    address: str, node_id: str, *, deadline: int, message: str = "spot instance preempted"
) -> float:
    """`ray drain-node` with a preemption notice, as an operator or an autoscaler sends it;
    when it was sent (`time.time()`). The cluster's token authentication is as this process
    has it."""
    command = [
        str(Path(sys.executable).parent / "ray"),
        "drain-node",
        "--address",
        address,
        "--node-id",
        node_id,
        "--reason",
        "DRAIN_NODE_REASON_PREEMPTION",
        "--reason-message",
        message,
        "--deadline-remaining-seconds",
        str(deadline),
    ]
    sent = time.time()
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"ray drain-node failed: {done.stderr.strip()}")
    return sent
