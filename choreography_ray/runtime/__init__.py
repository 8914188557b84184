"""The Ray shell: host actors, activation and routing, the Jobs client."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "AsyncJobs": "client",
    "Jobs": "client",
    "connect": "connection",
    "start_hosts": "placement",
    "stop_hosts": "placement",
}
"""Each public name's module, imported when first asked for: a module of the shell (the
command line's argument checks, its control-store reads) must not load the client and the
host actors with it."""

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
