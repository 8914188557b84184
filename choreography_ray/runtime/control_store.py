"""What a command that only reads needs of the cluster, read from Ray's control store without
joining the cluster.

`jobs list`, `jobs show` and `jobs steps` read the jobs from storage (the truth); of the cluster
they need only what lies in Ray's key-value store: the configuration (storage URL, job modules),
each host's advertisement (what it could not import), and the package of a submitted job whose
modules this process lacks. Joining the cluster as a driver (`ray.init`) to read them starts a
core worker and connects it to the raylet: 1.2 s on a calm 2-core machine and 5-10 s while a
large job keeps it busy, against a few milliseconds for one connection to the control store.
That client (`ray._raylet.GcsClient`) is not a documented Ray API; docs/decisions.md says why
it is used and what falls back when it cannot be.
"""

from __future__ import annotations

from typing import Any

from ..jobs.errors import ClusterAuthenticationError
from ..placement.capability import HostAdvert
from .adverts import ADVERT_PREFIX, parse_advert
from .config import ClusterConfig, missing_config
from .constants import CONFIG_KEY

CALL_SECONDS = 5.0
"""How long one read of the control store may take."""
PACKAGE_SECONDS = 30.0
"""How long reading one runtime env package may take (Ray allows up to 512 MiB)."""
_ALIVE = 0
"""`GcsNodeInfo.state` of a live node."""


def control_store_address(address: str | None) -> str | None:
    """The control store's `host:port` for a command's `--address`: 'auto' is the cluster this
    machine runs (or RAY_ADDRESS); a `host:port` is itself. None when only joining can reach
    it: no address (a local Ray of this command's own), a Ray Client `ray://` address, or no
    running cluster found (joining then says what is wrong)."""
    import ray

    if address is None or address.startswith(("ray://", "local")) or ray.is_initialized():
        return None  # a process that has joined reads through its connection
    if address != "auto":
        return address
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError):
        return None  # no cluster found, or RAY_ADDRESS is a Ray Client address


class ControlStore:
    """Reads of one cluster's control store, each bounded by `CALL_SECONDS`."""

    def __init__(self, address: str) -> None:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # not in Ray's _raylet.pyi
        from ray.exceptions import AuthenticationError

        from .connection import auth_message, check_reachable, quiet_stderr

        check_reachable(address)  # the client itself retries a dead address for 40 s
        try:
            with quiet_stderr():  # Ray's C++ client logs a refused token to stderr
                self._client: Any = GcsClient(address=address)
        except AuthenticationError:
            raise ClusterAuthenticationError(auth_message(address)) from None

    def config(self, namespace: str) -> ClusterConfig:
        """The configuration of the job system in Ray namespace `namespace`, which must be
        there (the same one-line error as when joined)."""
        raw = self._client.internal_kv_get(CONFIG_KEY, namespace.encode(), timeout=CALL_SECONDS)
        if raw is None:
            raise missing_config(namespace)
        return ClusterConfig.model_validate_json(raw)

    def package(self, uri: str) -> bytes | None:
        """A `gcs://` package Ray uploaded for a runtime env (`PackageFetch`); None when the
        cluster no longer holds it. Ray keeps packages outside any namespace."""
        found: bytes | None = self._client.internal_kv_get(
            uri.encode(), None, timeout=PACKAGE_SECONDS
        )
        return found

    def adverts(self, namespace: str) -> dict[str, HostAdvert]:
        """The advertisements of the hosts on live nodes, by host name; one that cannot be
        read is left out, as when joined. A host of a dead node may have left its own."""
        keys = self._client.internal_kv_keys(
            ADVERT_PREFIX, namespace.encode(), timeout=CALL_SECONDS
        )
        if not keys:
            return {}
        raw = self._client.internal_kv_multi_get(keys, namespace.encode(), timeout=CALL_SECONDS)
        nodes = self._client.get_all_node_info(timeout=CALL_SECONDS)
        alive = {node_id.hex() for node_id, info in nodes.items() if info.state == _ALIVE}
        found: dict[str, HostAdvert] = {}
        for key, value in raw.items():
            advert = parse_advert(key, value)
            if advert is not None and advert.node_id in alive:
                found[advert.name] = advert
        return found


def reach(address: str | None) -> ControlStore | None:
    """The control store of the cluster at `address`, or None when a command must join."""
    found = control_store_address(address)
    return None if found is None else ControlStore(found)
