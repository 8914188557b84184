"""The operator's console: a small server-rendered web view of jobs, steps and the cluster.

    choreography console                      # the cluster on this machine, read-only
    choreography console --storage sqlite:///.choreography/jobs.db   # storage only, no Ray

`create_app` builds the aiohttp application from a `JobsReader` over any storage provider and,
optionally, the cluster's actions and view; `choreography_ray.console.ray_cluster` supplies
those from Ray. docs/console.md is the user's guide.
"""

from __future__ import annotations

from ..exports import lazy_names

_WHERE = {
    "ConsoleSettings": "app",
    "create_app": "app",
    "ClientActions": "ports",
    "ClusterSnapshot": "ports",
    "ClusterView": "ports",
    "JobActions": "ports",
    "ManagerActions": "ports",
    "JobFilter": "reader",
    "JobsReader": "reader",
    "Page": "reader",
    "DEFAULT_HOST": "server",
    "DEFAULT_PORT": "server",
    "console_app": "server",
    "serve": "server",
}
"""Each public name's module, imported when the name is first asked for: the command line
reads storage through `console.reader` and must not pay for aiohttp (about 0.1 s) to do so."""

__all__ = sorted(_WHERE)

__getattr__ = lazy_names(__name__, _WHERE)
