"""A control store that answers as Ray's does, as much as a reading command asks of it: its
replies built by Ray's own message classes, over gRPC."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import grpc
from ray.core.generated import gcs_pb2
from ray.core.generated import gcs_service_pb2 as pb

NODE_ALIVE, NODE_DEAD = b"\x01" * 28, b"\x02" * 28
TOKEN = "0123456789abcdef0123456789abcdef"


class FakeControlStore:
    """Ray's key-value and node services over gRPC, as much as a reading command asks of them;
    `token` set: a call without it is refused as Ray refuses it."""

    def __init__(self) -> None:
        self.kv: dict[tuple[bytes, bytes], bytes] = {}
        self.token: str | None = None

    def handler(self) -> Any:
        def checked(reply: Callable[[bytes], Any]) -> Any:
            def answer(request: bytes, context: Any) -> bytes:
                sent = dict(context.invocation_metadata()).get("authorization")
                if self.token is not None and sent != f"Bearer {self.token}":
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken")
                return reply(request).SerializeToString()

            return grpc.unary_unary_rpc_method_handler(answer)

        def get(raw: bytes) -> Any:
            asked = pb.InternalKVGetRequest.FromString(raw)
            value = self.kv.get((asked.namespace, asked.key))
            if value is None:
                missing = pb.InternalKVGetReply()
                missing.status.code, missing.status.message = 17, "Failed to find the key"
                return missing
            return pb.InternalKVGetReply(value=value)

        def keys(raw: bytes) -> Any:
            asked = pb.InternalKVKeysRequest.FromString(raw)
            found = [k for ns, k in self.kv if ns == asked.namespace and k.startswith(asked.prefix)]
            return pb.InternalKVKeysReply(results=found)

        def multi_get(raw: bytes) -> Any:
            asked = pb.InternalKVMultiGetRequest.FromString(raw)
            reply = pb.InternalKVMultiGetReply()
            for key in asked.keys:
                if (asked.namespace, key) in self.kv:
                    reply.results.add(key=key, value=self.kv[(asked.namespace, key)])
            return reply

        def nodes(raw: bytes) -> Any:
            reply = pb.GetAllNodeInfoReply(total=2)
            reply.node_info_list.add(node_id=NODE_ALIVE, state=gcs_pb2.GcsNodeInfo.ALIVE)
            reply.node_info_list.add(node_id=NODE_DEAD, state=gcs_pb2.GcsNodeInfo.DEAD)
            return reply

        kv = grpc.method_handlers_generic_handler(
            "ray.rpc.InternalKVGcsService",
            {
                "InternalKVGet": checked(get),
                "InternalKVKeys": checked(keys),
                "InternalKVMultiGet": checked(multi_get),
            },
        )
        node_info = grpc.method_handlers_generic_handler(
            "ray.rpc.NodeInfoGcsService", {"GetAllNodeInfo": checked(nodes)}
        )
        return kv, node_info


@contextmanager
def serving(fake: FakeControlStore) -> Iterator[str]:
    """`fake` served on this machine; its `host:port`."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(fake.handler())
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)
