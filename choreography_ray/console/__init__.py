"""The operator's console: a small server-rendered web view of jobs, steps and the cluster.

    choreography console                      # the cluster on this machine, read-only
    choreography console --storage sqlite:///.choreography/jobs.db   # storage only, no Ray

`create_app` builds the aiohttp application from a `JobsReader` over any storage provider and,
optionally, the cluster's actions and view; `choreography_ray.console.ray_cluster` supplies
those from Ray. docs/console.md is the user's guide.
"""

from .app import ConsoleSettings, create_app
from .ports import ClientActions, ClusterSnapshot, ClusterView, JobActions, ManagerActions
from .reader import JobFilter, JobsReader, Page
from .server import DEFAULT_HOST, DEFAULT_PORT, console_app, serve

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "ClientActions",
    "ClusterSnapshot",
    "ClusterView",
    "ConsoleSettings",
    "JobActions",
    "JobFilter",
    "JobsReader",
    "ManagerActions",
    "Page",
    "console_app",
    "create_app",
    "serve",
]
