"""choreography_ray: durable, recoverable jobs on Ray.

A job plans its work as steps, saves the plan, and runs the steps on the cluster's worker
nodes; when a node, a process or the whole cluster dies, jobs pick up where they were.
"""

from .jobs import *  # noqa: F403
from .jobs import __all__ as _jobs_all
from .storage import JobQuery, StorageProvider, StorageURL, open_storage

__version__ = "0.1.0"

__all__ = [
    *_jobs_all,
    "JobQuery",
    "StorageProvider",
    "StorageURL",
    "__version__",
    "open_storage",
]
