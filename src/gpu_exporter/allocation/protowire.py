"""The pod-resources messages in protobuf's wire format, without the protobuf runtime.

The client reads List's and GetAllocatableResources' answers (:mod:`.podresources`) and the
simulated kubelet writes them (:mod:`.server`): strings, repeated strings and nested messages of
``proto/podresources.proto``. That takes the few primitives of the wire format here (varint
keys, length-delimited fields) instead of protobuf's runtime, which cost the process ~1.4 MiB
(docs/performance.md, issue 18). As protobuf does, a reader skips fields it does not know and
takes a singular field's last value; writers leave proto3 defaults (empty strings) out and write
an ``optional`` field whenever it is set.

:data:`FIELD_NUMBERS` is the part of the ``.proto`` that is read and written;
tests/allocation/test_protowire.py checks it against the compiled descriptor and round-trips
messages through the generated classes (protobuf is a development dependency).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

SERVICE: Final = "v1.PodResourcesLister"  # the package and service of the .proto

FIELD_NUMBERS: Final[Mapping[str, Mapping[str, int]]] = {
    "ListPodResourcesResponse": {"pod_resources": 1},
    "PodResources": {"name": 1, "namespace": 2, "containers": 3},
    "ContainerResources": {"name": 1, "devices": 2, "dynamic_resources": 5},
    "ContainerDevices": {"resource_name": 1, "device_ids": 2},
    "DynamicResource": {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4},
    "ClaimResource": {
        "cdi_devices": 1,
        "driver_name": 2,
        "pool_name": 3,
        "device_name": 4,
        "share_id": 5,
    },
    "CDIDevice": {"name": 1},
    "AllocatableResourcesResponse": {"devices": 1},
    "GetPodResourcesRequest": {"pod_name": 1, "pod_namespace": 2},
    "GetPodResourcesResponse": {"pod_resources": 1},
}

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

Fields = dict[str, list[bytes]]  # a message's known length-delimited fields, by name


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


# --- reading -----------------------------------------------------------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def _raw_fields(data: bytes) -> Iterator[tuple[int, bytes | None]]:
    """(field number, payload) of each field; None for the numeric ones (this schema has none
    it reads)."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, kind = key >> 3, key & 7
        if kind == _VARINT:
            _, pos = _varint(data, pos)
            yield number, None
        elif kind in (_I64, _I32):
            pos += 8 if kind == _I64 else 4
            yield number, None
        elif kind == _LEN:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise WireError(f"field {number}: {size} bytes announced, {len(data) - pos} left")
            yield number, data[pos : pos + size]
            pos += size
        else:
            raise WireError(f"field {number}: wire type {kind} (groups are not in this schema)")
    if pos != len(data):
        raise WireError("truncated fixed-width field")


def parse(data: bytes, message: str) -> Fields:
    """The fields of ``message`` (a name in :data:`FIELD_NUMBERS`) that it knows, in order."""
    names = {number: name for name, number in FIELD_NUMBERS[message].items()}
    fields: Fields = {}
    for number, payload in _raw_fields(data):
        name = names.get(number)
        if name is not None and payload is not None:
            fields.setdefault(name, []).append(payload)
    return fields


def text(fields: Fields, name: str) -> str:
    """A singular string field: its last value, or "" when absent."""
    values = fields.get(name)
    return utf8(values[-1]) if values else ""


def utf8(payload: bytes) -> str:
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"a string that is not UTF-8: {exc}") from None


# --- writing -----------------------------------------------------------------------------------


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field(message: str, name: str, payload: bytes | str, *, always: bool = False) -> bytes:
    """One length-delimited field: a message (bytes), always written, even empty; or a string,
    left out when empty (a proto3 default) unless ``always`` (repeated or ``optional``)."""
    if isinstance(payload, str):
        if not payload and not always:
            return b""
        payload = payload.encode("utf-8")
    data = payload
    key = FIELD_NUMBERS[message][name] << 3 | _LEN
    return _encode_varint(key) + _encode_varint(len(data)) + data
