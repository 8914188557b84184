"""The protocol buffer wire format of the few control-store messages a reading command sends
and reads (`control_store`), written and read by hand.

Ray's generated message classes load only with Ray itself (half a second of a command's CPU);
these messages are a handful of bytes fields, so the command encodes and decodes them here.
`tests/runtime/test_protobuf_wire.py` checks every one against Ray's own classes, so a Ray
release that renumbers a field fails there rather than in a user's terminal.
"""

from __future__ import annotations

from collections.abc import Iterator

Fields = dict[int, list[int | bytes]]
"""A message's fields by number, each with its values in order (a repeated field has many)."""

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def varint(value: int) -> bytes:
    """`value` (not negative) as a base-128 varint."""
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def field(number: int, value: bytes) -> bytes:
    """One length-delimited field (bytes, string or an embedded message)."""
    return varint(number << 3 | _BYTES) + varint(len(value)) + value


def message(*fields: tuple[int, bytes]) -> bytes:
    """A message of length-delimited fields, in the order given; a repeated field appears as
    many times as it has values."""
    return b"".join(field(number, value) for number, value in fields)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("a protocol buffer message ends inside a varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _entries(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        number, kind = key >> 3, key & 7
        value: int | bytes
        if kind == _VARINT:
            value, at = _read_varint(data, at)
        elif kind == _BYTES:
            size, at = _read_varint(data, at)
            value, at = data[at : at + size], at + size
            if at > len(data):
                raise ValueError("a protocol buffer field runs past its message")
        elif kind in (_FIXED64, _FIXED32):
            size = 8 if kind == _FIXED64 else 4
            value, at = int.from_bytes(data[at : at + size], "little"), at + size
        else:
            raise ValueError(f"protocol buffer wire type {kind} is not read here")
        yield number, value


def fields(data: bytes) -> Fields:
    """The fields of a message. Unknown fields are kept; a field left at its default (0,
    empty) is absent, as protocol buffers leave it off the wire."""
    found: Fields = {}
    for number, value in _entries(data):
        found.setdefault(number, []).append(value)
    return found


def first_bytes(found: Fields, number: int) -> bytes:
    """The bytes of field `number`; empty when it is absent (its default)."""
    values = found.get(number)
    return values[0] if values and isinstance(values[0], bytes) else b""


def first_int(found: Fields, number: int) -> int:
    """The integer of field `number`; 0 when it is absent (its default)."""
    values = found.get(number)
    return values[0] if values and isinstance(values[0], int) else 0


def all_bytes(found: Fields, number: int) -> list[bytes]:
    """Every value of the repeated bytes (or message) field `number`."""
    return [v for v in found.get(number, []) if isinstance(v, bytes)]
