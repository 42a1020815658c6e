"""DRA devices to GPUs: CDI specs and mig-minors first, the driver's device names as fallback."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpu_exporter.allocation.cdi import (
    CdiIndex,
    CdiReader,
    DeviceNodes,
    MigMinor,
    parse_mig_minors,
    parse_spec,
)
from gpu_exporter.allocation.dra import (
    MIG_MINORS,
    NO_SUCH_DEVICE,
    UNKNOWN_NAME,
    VFIO,
    canonical_profile,
    resolve_claim,
    resolve_claims,
)
from gpu_exporter.allocation.podresources import ClaimDevice
from gpu_exporter.devices import DeviceId

# NVML index and device minor differ, as they may on a real node.
GPU_0 = DeviceId(0, "GPU-0", minor=3)
GPU_1 = DeviceId(1, "GPU-1", minor=1, mig_mode="enabled")
MIG_A = DeviceId(
    1, "MIG-A", parent_uuid="GPU-1", gpu_instance_id=1, compute_instance_id=0,
    mig_profile="3g.40gb", minor=1, placement=(9, 4, 4),
)  # fmt: skip
MIG_B = DeviceId(
    1, "MIG-B", parent_uuid="GPU-1", gpu_instance_id=9, compute_instance_id=0,
    mig_profile="1g.10gb", minor=1, placement=(19, 2, 1),
)  # fmt: skip
INVENTORY = [GPU_0, GPU_1, MIG_A, MIG_B]
KIND = "k8s.gpu.nvidia.com/claim"
MIG_MINORS_TEXT = """config 1
monitor 2
gpu1/gi1/access 147
gpu1/gi1/ci0/access 148
gpu1/gi9/access 219
gpu1/gi9/ci0/access 220
"""


def claim(device: str, *cdi: str, driver: str = "gpu.nvidia.com") -> ClaimDevice:
    return ClaimDevice("ns", "pod", "main", "ns", "c", driver, "node-1", device, cdi)


def index(**devices: DeviceNodes) -> CdiIndex:
    return CdiIndex(
        devices={f"{KIND}={name}": nodes for name, nodes in devices.items()},
        mig_minors=parse_mig_minors(MIG_MINORS_TEXT),
    )


EMPTY = CdiIndex()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpu-3", GPU_0),  # the minor, not NVML index 3
        ("gpu-1-mig-1g10gb-19-2", MIG_B),  # 25.12+: profile, GI profile id, placement start
        ("gpu-1-mig-3g40gb-9-4", MIG_A),
        ("gpu-1-mig-19-2-1", MIG_B),  # 25.3/25.8: GI profile id, start, size
        ("gpu-1-mig-9-4-4", MIG_A),
    ],
)
def test_device_names_resolve_without_specs(name: str, expected: DeviceId) -> None:
    assert resolve_claim(claim(name), INVENTORY, EMPTY) == expected


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("gpu-0", NO_SUCH_DEVICE),  # NVML index 0 has minor 3: no GPU of minor 0
        ("gpu-1-mig-2g20gb-14-0", NO_SUCH_DEVICE),  # no such placement
        ("gpu-1-mig-1g20gb-19-2", NO_SUCH_DEVICE),  # placement right, profile wrong
        ("gpu-vfio-0", VFIO),
        ("accelerator-7", UNKNOWN_NAME),
        ("", UNKNOWN_NAME),
        ("gpu-\uff11", UNKNOWN_NAME),  # a fullwidth digit is no minor
    ],
)
def test_names_that_resolve_to_nothing_say_why(name: str, reason: str) -> None:
    assert resolve_claim(claim(name), INVENTORY, EMPTY) == reason


def test_without_placements_a_unique_profile_still_names_the_instance() -> None:
    """Non-root NVML may refuse GPU instance info: no placement, but the profile is known."""
    unplaced = [dataclasses.replace(d, placement=None) for d in INVENTORY]
    mig_b = unplaced[3]
    assert resolve_claim(claim("gpu-1-mig-1g10gb-19-2"), unplaced, EMPTY) == mig_b
    twins = [*unplaced, dataclasses.replace(mig_b, uuid="MIG-C", gpu_instance_id=10)]
    assert resolve_claim(claim("gpu-1-mig-1g10gb-19-2"), twins, EMPTY) == NO_SUCH_DEVICE


def test_a_cdi_spec_wins_over_the_name() -> None:
    """The spec's /dev/nvidia<minor> is what the container got, whatever the name suggests."""
    specs = index(**{"uid-gpu-1": DeviceNodes(gpu_minors=(3,))})
    assert resolve_claim(claim("gpu-1", f"{KIND}=uid-gpu-1"), INVENTORY, specs) == GPU_0


def test_a_mig_instance_resolves_through_its_capability_minors() -> None:
    nodes = DeviceNodes(gpu_minors=(1,), cap_minors=(219, 220))
    specs = index(**{"uid-gpu-1-mig-x": nodes})
    # The name is not parsable: only the spec and mig-minors can tell (dynamic MIG, say).
    found = resolve_claim(claim("gpu-1-mig-x", f"{KIND}=uid-gpu-1-mig-x"), INVENTORY, specs)
    assert found == MIG_B


def test_capability_minors_missing_from_mig_minors_are_reported() -> None:
    specs = index(**{"uid-d": DeviceNodes(gpu_minors=(1,), cap_minors=(900, 901))})
    assert resolve_claim(claim("d", f"{KIND}=uid-d"), INVENTORY, specs) == MIG_MINORS


def test_only_the_devices_own_cdi_name_counts_when_the_kubelet_accumulates_them() -> None:
    """The 2nd device of a claim lists the 1st device's CDI name too (reference/dra.md)."""
    specs = index(
        **{
            "uid-gpu-3": DeviceNodes(gpu_minors=(3,)),
            "uid-gpu-1-mig-1g10gb-19-2": DeviceNodes(gpu_minors=(1,), cap_minors=(219, 220)),
        }
    )
    first, second = f"{KIND}=uid-gpu-3", f"{KIND}=uid-gpu-1-mig-1g10gb-19-2"
    assert resolve_claim(claim("gpu-3", first), INVENTORY, specs) == GPU_0
    assert resolve_claim(claim("gpu-1-mig-1g10gb-19-2", first, second), INVENTORY, specs) == MIG_B


def test_a_spec_of_edits_only_falls_back_to_the_name() -> None:
    """25.8 with sharing: a per-claim spec adds env vars; the devices are in the base spec."""
    specs = index(**{"uid": DeviceNodes()})
    assert resolve_claim(claim("gpu-3", f"{KIND}=uid"), INVENTORY, specs) == GPU_0


def test_compute_domain_channels_are_skipped_and_other_drivers_ignored() -> None:
    claims = [
        claim("channel-0", driver="compute-domain.nvidia.com"),
        claim("daemon-1", driver="compute-domain.nvidia.com"),
        claim("eth0", driver="nic.example.com"),
        claim("gpu-3"),
    ]
    result = resolve_claims(claims, INVENTORY, EMPTY)
    assert [r.device for r in result.resolved] == [GPU_0]
    assert result.unresolved == ()
    assert result.compute_domain == 2


def test_canonical_profile_names() -> None:
    assert canonical_profile("1g.10gb") == "1g10gb"
    assert canonical_profile("1g.10gb+me") == "1g10gb-me"


def test_cdi_specs_in_yaml_and_json_with_the_device_nodes_that_matter() -> None:
    spec = """
cdiVersion: 0.8.0
kind: k8s.gpu.nvidia.com/claim
containerEdits:
  deviceNodes: [{path: /dev/nvidiactl}, {path: /dev/nvidia-uvm}]
devices:
  - name: uid-gpu-0
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0}]
  - name: uid-gpu-1-mig-1g10gb-19-2
    containerEdits:
      deviceNodes:
        - {path: /dev/nvidia1}
        - {path: /dev/nvidia-caps/nvidia-cap219, type: c, major: 508, minor: 219}
        - {path: /dev/nvidia-caps/nvidia-cap220}
"""
    assert parse_spec(spec) == {
        f"{KIND}=uid-gpu-0": DeviceNodes(gpu_minors=(0,)),
        f"{KIND}=uid-gpu-1-mig-1g10gb-19-2": DeviceNodes((1,), (219, 220)),
    }
    assert parse_spec('{"kind": "a.com/b", "devices": [{"name": "x"}]}', json_format=True) == {
        "a.com/b=x": DeviceNodes()
    }
    for broken in ("kind: [", "just text", "kind: a/b\ndevices: 3", "devices: []"):
        assert parse_spec(broken) is None, broken


def test_mig_minors_lines() -> None:
    assert parse_mig_minors(MIG_MINORS_TEXT + "garbage\ngpu1/gi2/access x\n") == {
        147: MigMinor(1, 1, None),
        148: MigMinor(1, 1, 0),
        219: MigMinor(1, 9, None),
        220: MigMinor(1, 9, 0),
    }


def test_the_reader_follows_specs_as_they_come_and_go(tmp_path: Path) -> None:
    first, second = tmp_path / "run", tmp_path / "etc"
    first.mkdir()
    (tmp_path / "mig-minors").write_text(MIG_MINORS_TEXT)
    reader = CdiReader([first, second, tmp_path / "absent"], tmp_path / "mig-minors")
    spec = first / "k8s.gpu.nvidia.com-claim_uid.yaml"
    spec.write_text(
        "kind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: uid-gpu-0\n"
        "  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}\n"
    )
    (first / "notes.txt").write_text("not a spec")
    (first / "broken.yaml").write_text("kind: [")
    read = reader.read()
    assert read.devices == {f"{KIND}=uid-gpu-0": DeviceNodes(gpu_minors=(0,))}
    assert read.specs_read == 1
    assert read.mig_minors[220] == MigMinor(1, 9, 0)
    spec.unlink()  # the claim was unprepared
    assert reader.read().devices == {}
