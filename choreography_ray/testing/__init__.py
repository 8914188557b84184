"""Public helpers for testing jobs: an in-process cluster, fault injection, a fake clock, and a
multi-node Ray on one machine (`MultiNodeCluster`, loaded on first use: the rest never imports
Ray). `testing.hooks` names the host actors' hook (the runtime's) through which a fault reaches a
real cluster."""

from ..engine.clock import FakeClock
from .cluster import InProcessCluster
from .faults import LostAcks, StorageOutage, WriteFaults

_RAY_CLUSTER = {
    "ClusterNode",
    "ControlStoreOnRedis",
    "HealthChecks",
    "MultiNodeCluster",
    "NodeSpec",
}


def __getattr__(name: str) -> object:
    if name in _RAY_CLUSTER:
        from . import ray_cluster

        return getattr(ray_cluster, name)
    raise AttributeError(f"module 'choreography_ray.testing' has no attribute {name!r}")


__all__ = [
    "ClusterNode",  # loaded on first use (see __getattr__), like the other Ray ones
    "ControlStoreOnRedis",
    "FakeClock",
    "HealthChecks",
    "InProcessCluster",
    "LostAcks",
    "MultiNodeCluster",
    "NodeSpec",
    "StorageOutage",
    "WriteFaults",
]
