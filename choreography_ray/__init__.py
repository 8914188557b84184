"""choreography_ray: durable, recoverable jobs on Ray.

A job plans its work as steps, saves the plan, and runs the steps on the cluster's worker
nodes; when a node, a process or the whole cluster dies, jobs pick up where they were.
"""

from .exports import lazy_names
from .jobs import *  # noqa: F403
from .jobs import __all__ as _jobs_all
from .storage import JobOrder, JobQuery, StorageProvider, StorageURL, open_storage

__version__ = "0.1.0"

# The Ray runtime loads only when asked for: declaring jobs never imports Ray.
__getattr__ = lazy_names(
    __name__, {"connect": "runtime", "Jobs": "runtime", "AsyncJobs": "runtime"}
)


__all__ = [
    *_jobs_all,
    "AsyncJobs",  # noqa: F405 - loaded on first use (see __getattr__)
    "JobOrder",
    "JobQuery",
    "Jobs",  # noqa: F405
    "StorageProvider",
    "StorageURL",
    "__version__",
    "connect",  # noqa: F405
    "open_storage",
]
