"""What a command that only reads needs of the cluster, read from Ray's control store without
joining the cluster.

`jobs list`, `jobs show` and `jobs steps` read the jobs from storage (the truth); of the cluster
they need only what lies in Ray's key-value store: the configuration (storage URL, job modules),
each host's advertisement (what it could not import), and the package of a submitted job whose
modules this process lacks. Joining the cluster as a driver (`ray.init`) to read them starts a
core worker and connects it to the raylet: 1.2 s on a calm 2-core machine and 5-10 s while a
large job keeps it busy, against a few milliseconds for one connection to the control store.
Importing Ray at all costs half a second of CPU, so the connection is a plain gRPC channel
(grpcio comes with Ray) carrying the control store's own messages, encoded in `protobuf_wire`,
with the cluster's token as Ray's clients send it. The messages are not a documented Ray API;
docs/decisions.md says why they are used and what falls back when they cannot be.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ..jobs.errors import ClusterAuthenticationError, ClusterUnreachableError
from ..placement.capability import HostAdvert
from . import protobuf_wire as wire
from .adverts import ADVERT_PREFIX, parse_advert
from .config import ClusterConfig, missing_config
from .constants import CONFIG_KEY
from .reachability import auth_message, check_reachable

CALL_SECONDS = 5.0
"""How long one read of the control store may take."""
PACKAGE_SECONDS = 30.0
"""How long reading one runtime env package may take (Ray allows up to 512 MiB)."""
_ALIVE = 0
"""`GcsNodeInfo.state` of a live node (the default, so left off the wire)."""
_NOT_FOUND = 17
"""`GcsStatus.code` of a key the store does not hold (Ray's `StatusCode::NotFound`)."""
_KV = "/ray.rpc.InternalKVGcsService/"
_NODES = "/ray.rpc.NodeInfoGcsService/"


def control_store_address(address: str | None) -> str | None:
    """The control store's `host:port` for a command's `--address`: 'auto' is the cluster this
    machine runs (or RAY_ADDRESS); a `host:port` is itself. None when only joining can reach
    it: no address (a local Ray of this command's own), a Ray Client `ray://` address, a
    cluster spoken to over TLS (RAY_USE_TLS), or no running cluster found (joining then says
    what is wrong)."""
    if address is None or address.startswith(("ray://", "local")) or _joined() or _tls():
        return None  # a process that has joined reads through its connection
    if address != "auto":
        return address
    from ray._private.services import canonicalize_bootstrap_address  # finding it needs Ray

    try:
        return canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError):
        return None  # no cluster found, or RAY_ADDRESS is a Ray Client address


def _joined() -> bool:
    ray = sys.modules.get("ray")  # not imported: not joined, and not worth importing to ask
    return ray is not None and bool(ray.is_initialized())


def _tls() -> bool:
    return os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")


def auth_metadata() -> tuple[tuple[str, str], ...]:
    """The header Ray's clients send with every call when RAY_AUTH_MODE is `token`, with the
    token from where Ray takes it: RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names,
    else ~/.ray/auth_token. None found (or another mode): no header, and a cluster that wants
    one refuses the call."""
    if os.environ.get("RAY_AUTH_MODE", "disabled").lower() != "token":
        return ()
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if not token:
        path = os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token"
        try:
            token = Path(path).read_text().strip()
        except OSError:
            return ()
    return (("authorization", f"Bearer {token}"),)


class ControlStore:
    """Reads of one cluster's control store, each bounded by `CALL_SECONDS`."""

    def __init__(self, address: str) -> None:
        import grpc

        check_reachable(address)  # a channel would wait for a dead address until its deadline
        self.address = address
        self._grpc: Any = grpc
        self._channel = grpc.insecure_channel(
            address,
            options=[("grpc.max_receive_message_length", -1)],  # packages: up to 512 MiB
        )
        self._metadata = auth_metadata()

    def _call(self, method: str, request: bytes, timeout: float = CALL_SECONDS) -> wire.Fields:
        """The reply's fields; a refused token, a store that does not answer in `timeout` or
        any other failed call is a one-line error naming the cluster."""
        grpc = self._grpc
        stub = self._channel.unary_unary(method)  # bytes in, bytes out
        try:
            reply: bytes = stub(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            code = error.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                raise ClusterAuthenticationError(auth_message(self.address)) from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(
                    f"the control store of the Ray cluster at {self.address!r} did not answer "
                    f"within {timeout:g} s"
                ) from None
            raise ClusterUnreachableError(
                f"cannot read the control store of the Ray cluster at {self.address!r}: "
                f"{error.details() or code}"
            ) from None
        return wire.fields(reply)

    def _kv(self, method: str, request: bytes, timeout: float = CALL_SECONDS) -> wire.Fields:
        """A key-value call's reply fields; none when the key is not there."""
        found = self._call(_KV + method, request, timeout)
        status = wire.fields(wire.first_bytes(found, 1))
        code = wire.first_int(status, 1)
        if code == _NOT_FOUND:
            return {}
        if code:
            raise ClusterUnreachableError(
                f"the control store of the Ray cluster at {self.address!r} refused {method}: "
                f"{wire.first_bytes(status, 2).decode(errors='replace')}"
            )
        return found

    def _get(self, key: bytes, namespace: bytes | None, timeout: float) -> bytes | None:
        request = wire.message((1, key), *([(2, namespace)] if namespace else []))
        found = self._kv("InternalKVGet", request, timeout)
        return wire.first_bytes(found, 2) if found else None

    def config(self, namespace: str) -> ClusterConfig:
        """The configuration of the job system in Ray namespace `namespace`, which must be
        there (the same one-line error as when joined)."""
        raw = self._get(CONFIG_KEY, namespace.encode(), CALL_SECONDS)
        if raw is None:
            raise missing_config(namespace)
        return ClusterConfig.model_validate_json(raw)

    def package(self, uri: str) -> bytes | None:
        """A `gcs://` package Ray uploaded for a runtime env (`PackageFetch`); None when the
        cluster no longer holds it. Ray keeps packages outside any namespace."""
        return self._get(uri.encode(), None, PACKAGE_SECONDS)

    def adverts(self, namespace: str) -> dict[str, HostAdvert]:
        """The advertisements of the hosts on live nodes, by host name; one that cannot be
        read is left out, as when joined. A host of a dead node may have left its own."""
        space = namespace.encode()
        listed = self._kv("InternalKVKeys", wire.message((1, ADVERT_PREFIX), (2, space)))
        keys = wire.all_bytes(listed, 2)
        if not keys:
            return {}
        request = wire.message(*((1, key) for key in keys), (2, space))
        entries = wire.all_bytes(self._kv("InternalKVMultiGet", request), 2)
        nodes = wire.all_bytes(self._call(_NODES + "GetAllNodeInfo", b""), 2)
        alive = set()
        for node in nodes:
            info = wire.fields(node)
            if wire.first_int(info, 7) == _ALIVE:
                alive.add(wire.first_bytes(info, 1).hex())
        found: dict[str, HostAdvert] = {}
        for entry in entries:
            pair = wire.fields(entry)
            advert = parse_advert(wire.first_bytes(pair, 1), wire.first_bytes(pair, 2))
            if advert is not None and advert.node_id in alive:
                found[advert.name] = advert
        return found


def reach(address: str | None) -> ControlStore | None:
    """The control store of the cluster at `address`, or None when a command must join."""
    found = control_store_address(address)
    return None if found is None else ControlStore(found)
