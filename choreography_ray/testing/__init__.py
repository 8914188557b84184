"""Public helpers for testing jobs: an in-process cluster, fault injection, a fake clock."""

from ..engine.clock import FakeClock
from .cluster import InProcessCluster
from .faults import WriteFaults

__all__ = ["FakeClock", "InProcessCluster", "WriteFaults"]
