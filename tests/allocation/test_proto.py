"""The committed stubs: wire-compatible with upstream and reproducible from the .proto."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from google.protobuf import descriptor_pb2

from gpu_exporter.allocation.podresources import ClaimDevice, ContainerDevices, read_list
from gpu_exporter.allocation.proto import podresources_pb2 as pb

PROTO_DIR = Path(pb.__file__).parent
SRC = PROTO_DIR.parents[2]
GENERATED = ("podresources_pb2.py", "podresources_pb2.pyi", "podresources_grpc.py")
DATA = Path(__file__).parent / "data"
UPSTREAM_TABLE = DATA / "podresources-v1-upstream.yaml"
UPSTREAM_PROTO = DATA / "upstream" / "api.proto"
# grpclib's protoc plugin, installed beside this interpreter (regenerate.sh finds it on PATH).
GRPCLIB_PLUGIN = Path(sys.executable).with_name("protoc-gen-grpclib_python")
needs_grpc_tools = pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools is not installed"
)
_LABELS = {
    descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED: "repeated",
    descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL: "singular",
}
_SCALARS = {
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
}


def upstream_table() -> dict[str, object]:
    """The table's package, service, RPCs and fields, without its provenance notes."""
    table = yaml.safe_load(UPSTREAM_TABLE.read_text())
    assert len(table["commit"]) == 40, "the table must name the upstream commit it was read from"
    return {
        "package": table["package"],
        "service": table["service"],
        "methods": [tuple(m) for m in table["methods"]],
        "messages": {
            name: {field: tuple(spec[:3]) for field, spec in (fields or {}).items()}
            for name, fields in table["messages"].items()
        },
    }


def definitions(descriptor: descriptor_pb2.FileDescriptorProto) -> dict[str, object]:
    """The same shape, read from a compiled file descriptor."""
    package = descriptor.package
    (service,) = descriptor.service

    def local(type_name: str) -> str:
        return type_name.removeprefix(f".{package}.")

    def field(f: descriptor_pb2.FieldDescriptorProto) -> tuple[int, str, str]:
        label = "optional" if f.proto3_optional else _LABELS[f.label]
        kind = _SCALARS.get(f.type) or local(f.type_name)
        return (f.number, label, kind)

    return {
        "package": package,
        "service": service.name,
        "methods": [(m.name, local(m.input_type), local(m.output_type)) for m in service.method],
        "messages": {m.name: {f.name: field(f) for f in m.field} for m in descriptor.message_type},
    }


def compile_descriptor(proto: Path, out: Path) -> descriptor_pb2.FileDescriptorProto:
    """Compile ``proto`` with grpcio-tools into a descriptor set (nothing is imported)."""
    target = out / "descriptor.pb"
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{proto.parent}",
            f"--descriptor_set_out={target}", proto.name,
        ],
        check=True,
    )  # fmt: skip
    (descriptor,) = descriptor_pb2.FileDescriptorSet.FromString(target.read_bytes()).file
    return descriptor


def test_the_project_proto_matches_the_upstream_table() -> None:
    descriptor = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(descriptor)
    assert definitions(descriptor) == upstream_table(), (
        "podresources.proto drifted from the upstream pod-resources v1 API "
        f"({UPSTREAM_TABLE.name}); fix the .proto and run `make proto`"
    )


def test_the_dropped_class_name_number_stays_reserved() -> None:
    dynamic = pb.DESCRIPTOR.message_types_by_name["DynamicResource"]
    assert 1 not in dynamic.fields_by_number, "field 1 was class_name (removed in 1.31)"
    descriptor = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(descriptor)
    message = next(m for m in descriptor.message_type if m.name == "DynamicResource")
    assert [(r.start, r.end) for r in message.reserved_range] == [(1, 2)]


@needs_grpc_tools
def test_the_upstream_copy_matches_the_upstream_table(tmp_path: Path) -> None:
    """The stand-in kubelet's proto (test data) says what the table says."""
    assert definitions(compile_descriptor(UPSTREAM_PROTO, tmp_path)) == upstream_table()


def test_wire_bytes() -> None:
    devices = b"\x0a\x01r\x12\x01d"
    container = b"\x0a\x01c\x12\x06" + devices
    pod = b"\x0a\x01p\x12\x01n\x1a\x0b" + container
    expected = b"\x0a\x13" + pod
    message = pb.ListPodResourcesResponse()
    message.pod_resources.add(name="p", namespace="n").containers.add(name="c").devices.add(
        resource_name="r", device_ids=["d"]
    )
    assert message.SerializeToString() == expected


def test_cpu_and_memory_fields_parse_and_unknown_fields_are_skipped() -> None:
    # ContainerResources with cpu_ids (3, packed), memory (4) and a field no kubelet sends (9);
    # PodResources with its pod-level cpu_ids (4).
    devices = b"\x0a\x0envidia.com/gpu\x12\x03GPU"
    container = (
        b"\x0a\x01c\x12" + bytes([len(devices)]) + devices + b"\x1a\x02\x01\x02\x22\x00"
        + b"\x4a\x01x"
    )  # fmt: skip
    pod = b"\x0a\x01p\x12\x01n\x1a" + bytes([len(container)]) + container + b"\x22\x01\x05"
    message = pb.ListPodResourcesResponse.FromString(b"\x0a" + bytes([len(pod)]) + pod)
    parsed = message.pod_resources[0].containers[0]
    assert (parsed.devices[0].resource_name, list(parsed.devices[0].device_ids)) == (
        "nvidia.com/gpu",
        ["GPU"],
    )
    assert list(parsed.cpu_ids) == [1, 2]
    assert list(message.pod_resources[0].cpu_ids) == [5]
    # The exporter's reader skips the same fields.
    containers, _ = read_list(b"\x0a" + bytes([len(pod)]) + pod)
    assert containers == [ContainerDevices("n", "p", "c", "nvidia.com/gpu", ("GPU",))]


def test_a_kubelet_before_1_31_sends_class_name_which_is_skipped() -> None:
    # DynamicResource{class_name=1 "gpu.nvidia.com", claim_name=2 "c",
    #                 claim_resources=4 [{cdi_devices=1 [{name=1 "k/c=d"}]}]}
    cdi = b"\x0a\x05k/c=d"
    claim_resource = b"\x0a" + bytes([len(cdi)]) + cdi
    dynamic = b"\x0a\x0egpu.nvidia.com\x12\x01c\x22" + bytes([len(claim_resource)]) + claim_resource
    parsed = pb.DynamicResource.FromString(dynamic)
    assert parsed.claim_name == "c"
    assert [d.name for d in parsed.claim_resources[0].cdi_devices] == ["k/c=d"]
    assert not parsed.claim_resources[0].HasField("share_id")
    # The exporter's reader skips class_name too, in a whole List answer.
    container = b"\x0a\x01c\x2a" + bytes([len(dynamic)]) + dynamic
    pod = b"\x0a\x01p\x12\x01n\x1a" + bytes([len(container)]) + container
    _, claims = read_list(b"\x0a" + bytes([len(pod)]) + pod)
    assert claims == [ClaimDevice("n", "p", "c", "", "c", "", "", "", ("k/c=d",), None)]


@needs_grpc_tools
def test_stubs_are_regenerated_from_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{SRC}", f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}", f"--grpclib_python_out={tmp_path}",
            f"--plugin=protoc-gen-grpclib_python={GRPCLIB_PLUGIN}",
            str(PROTO_DIR.relative_to(SRC) / "podresources.proto"),
        ],
        check=True, cwd=SRC,
    )  # fmt: skip
    for name in GENERATED:
        fresh = tmp_path / PROTO_DIR.relative_to(SRC) / name
        assert fresh.read_text() == (PROTO_DIR / name).read_text(), f"{name}: run regenerate.sh"
