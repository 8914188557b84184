"""The Ray shell: host actors, activation and routing, the Jobs client."""

from .client import AsyncJobs, Jobs
from .connection import connect
from .placement import start_hosts, stop_hosts

__all__ = ["AsyncJobs", "Jobs", "connect", "start_hosts", "stop_hosts"]
