"""The committed stubs: wire-compatible with upstream and reproducible from the .proto."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_exporter.allocation.proto import podresources_pb2 as pb

PROTO_DIR = Path(pb.__file__).parent
SRC = PROTO_DIR.parents[2]
GENERATED = ("podresources_pb2.py", "podresources_pb2.pyi", "podresources_pb2_grpc.py")


def test_upstream_names_and_numbers() -> None:
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources"]
    fields = {
        name: {f.name: f.number for f in pb.DESCRIPTOR.message_types_by_name[name].fields}
        for name in pb.DESCRIPTOR.message_types_by_name
    }
    assert fields["ListPodResourcesResponse"] == {"pod_resources": 1}
    assert fields["PodResources"] == {"name": 1, "namespace": 2, "containers": 3}
    assert fields["ContainerResources"] == {"name": 1, "devices": 2}
    assert fields["ContainerDevices"] == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert fields["AllocatableResourcesResponse"] == {"devices": 1}
    assert fields["NUMANode"] == {"ID": 1}


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


def test_fields_of_newer_kubelets_are_skipped() -> None:
    # ContainerResources with cpu_ids (3) and memory (4), PodResources with cpu_ids (4).
    devices = b"\x0a\x0envidia.com/gpu\x12\x03GPU"
    container = b"\x0a\x01c\x12" + bytes([len(devices)]) + devices + b"\x1a\x02\x01\x02\x22\x00"
    pod = b"\x0a\x01p\x12\x01n\x1a" + bytes([len(container)]) + container + b"\x22\x01\x05"
    message = pb.ListPodResourcesResponse.FromString(b"\x0a" + bytes([len(pod)]) + pod)
    parsed = message.pod_resources[0].containers[0].devices[0]
    assert (parsed.resource_name, list(parsed.device_ids)) == ("nvidia.com/gpu", ["GPU"])


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools is not installed"
)
def test_stubs_are_regenerated_from_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{SRC}", f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
            str(PROTO_DIR.relative_to(SRC) / "podresources.proto"),
        ],
        check=True, cwd=SRC,
    )  # fmt: skip
    for name in GENERATED:
        fresh = tmp_path / PROTO_DIR.relative_to(SRC) / name
        assert fresh.read_text() == (PROTO_DIR / name).read_text(), f"{name}: run regenerate.sh"
