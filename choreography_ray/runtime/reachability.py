"""Whether a cluster address answers, and what to say when its cluster refuses this process's
token: shared by joining (`connection`) and by reading the control store (`control_store`),
neither of which may wait for Ray's own retries. Imports no Ray.
"""

from __future__ import annotations

import os
import socket

from ..jobs.errors import ClusterUnreachableError, ConfigurationError
from ..storage.url import redact

AUTH_HINT = (
    "set RAY_AUTH_MODE=token (the token comes from ~/.ray/auth_token, RAY_AUTH_TOKEN or "
    "RAY_AUTH_TOKEN_PATH)"
)


def check_reachable(address: str | None, timeout: float = 3.0) -> str | None:
    """Fail fast, with a clear message, when a cluster address refuses connections; the GCS
    address to check authentication against, for a "host:port" address.

    Ray itself keeps retrying an unreachable head for minutes before it gives up.
    """
    if not address or address == "auto" or address.startswith("local"):
        return None
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigurationError(
            f"cluster address {address!r} is not 'auto', 'host:port' or 'ray://host:port'"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as error:
        raise ClusterUnreachableError(
            f"cannot reach the Ray cluster at {address!r}: {error}"
        ) from None
    return None if address.startswith("ray://") else target


def auth_message(address: str | None) -> str:
    """What to do about a cluster that refused this process: set the mode, or the token."""
    mode = os.environ.get("RAY_AUTH_MODE", "disabled")
    where = f" at {redact(address)!r}" if address else ""
    if mode.lower() == "token":
        return (
            f"the Ray cluster{where} refused this process's authentication token; set the "
            "cluster's token in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"
        )
    return f"the Ray cluster{where} uses token authentication: {AUTH_HINT}"
