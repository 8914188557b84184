"""The control-store messages a reading command writes and reads by hand (`protobuf_wire`,
`control_store`) are Ray's own: each is checked against the classes Ray generates, so a Ray
release that changes one fails here."""

from __future__ import annotations

import pytest
from ray.core.generated import gcs_pb2, gcs_service_pb2

from choreography_ray.runtime import protobuf_wire as wire
from choreography_ray.runtime.control_store import _ALIVE, _KV, _NODES


def test_the_requests_are_rays():
    get = gcs_service_pb2.InternalKVGetRequest.FromString(
        wire.message((1, b"choreography_ray:cluster-config"), (2, b"ns"))
    )
    assert (get.key, get.namespace) == (b"choreography_ray:cluster-config", b"ns")
    keys = gcs_service_pb2.InternalKVKeysRequest.FromString(
        wire.message((1, b"prefix:"), (2, b"ns"))
    )
    assert (keys.prefix, keys.namespace) == (b"prefix:", b"ns")
    many = gcs_service_pb2.InternalKVMultiGetRequest.FromString(
        wire.message((1, b"a"), (1, b"b" * 300), (2, b"ns"))
    )
    assert (list(many.keys), many.namespace) == ([b"a", b"b" * 300], b"ns")


def test_the_replies_read_as_ray_writes_them():
    got = wire.fields(gcs_service_pb2.InternalKVGetReply(value=b"x" * 200).SerializeToString())
    assert wire.first_bytes(got, 2) == b"x" * 200
    assert wire.first_int(wire.fields(wire.first_bytes(got, 1)), 1) == 0  # OK: left off
    missing = gcs_service_pb2.InternalKVGetReply()
    missing.status.code, missing.status.message = 17, "Failed to find the key"
    status = wire.fields(wire.first_bytes(wire.fields(missing.SerializeToString()), 1))
    assert (wire.first_int(status, 1), wire.first_bytes(status, 2)) == (
        17,
        b"Failed to find the key",
    )
    keys = gcs_service_pb2.InternalKVKeysReply(results=[b"k1", b"k2"]).SerializeToString()
    assert wire.all_bytes(wire.fields(keys), 2) == [b"k1", b"k2"]
    many = gcs_service_pb2.InternalKVMultiGetReply()
    many.results.add(key=b"k1", value=b"v1")
    many.results.add(key=b"k2", value=b"")
    pairs = [wire.fields(e) for e in wire.all_bytes(wire.fields(many.SerializeToString()), 2)]
    assert [(wire.first_bytes(p, 1), wire.first_bytes(p, 2)) for p in pairs] == [
        (b"k1", b"v1"),
        (b"k2", b""),
    ]


def test_a_node_reads_with_its_id_and_whether_it_is_alive():
    reply = gcs_service_pb2.GetAllNodeInfoReply(total=2)
    alive = reply.node_info_list.add(node_id=b"\x01" * 28, node_manager_address="10.0.0.1")
    alive.state = gcs_pb2.GcsNodeInfo.ALIVE
    reply.node_info_list.add(node_id=b"\x02" * 28, state=gcs_pb2.GcsNodeInfo.DEAD)
    nodes = [wire.fields(n) for n in wire.all_bytes(wire.fields(reply.SerializeToString()), 2)]
    assert [(wire.first_bytes(n, 1), wire.first_int(n, 7)) for n in nodes] == [
        (b"\x01" * 28, _ALIVE),
        (b"\x02" * 28, gcs_pb2.GcsNodeInfo.DEAD),
    ]
    assert gcs_pb2.GcsNodeInfo.ALIVE == _ALIVE


def test_the_methods_are_rays():
    services = gcs_service_pb2.DESCRIPTOR.services_by_name
    for prefix, method in [
        (_KV, "InternalKVGet"),
        (_KV, "InternalKVKeys"),
        (_KV, "InternalKVMultiGet"),
        (_NODES, "GetAllNodeInfo"),
    ]:
        service = services[prefix.strip("/").removeprefix("ray.rpc.")]
        assert f"/{service.full_name}/" == prefix and method in service.methods_by_name


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**32, 2**63])
def test_a_varint_reads_back(value):
    assert wire.first_int(wire.fields(wire.varint(1 << 3) + wire.varint(value)), 1) == value


def test_a_cut_message_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match="runs past"):
        wire.fields(wire.field(2, b"abcdef")[:-2])
