"""The Ray shell: host actors, activation and routing, the Jobs client."""

from __future__ import annotations

from ..exports import lazy_names

_WHERE = {
    "AsyncJobs": "async_client",
    "Jobs": "client",
    "connect": "connection",
    "start_hosts": "placement",
    "stop_hosts": "placement",
}
"""Each public name's module, imported when first asked for: a module of the shell (the
command line's argument checks, its control-store reads) must not load the client and the
host actors with it."""

__all__ = sorted(_WHERE)

__getattr__ = lazy_names(__name__, _WHERE)
