"""Every device-id form the NVIDIA and GKE device plugins report, parsed and resolved."""

from __future__ import annotations

import pytest

from gpu_exporter.allocation.ids import DeviceRef, parse_device_id, resolve, schedulable

from .helpers import (
    GPU_A,
    GPU_B,
    GPU_C,
    GPU_D,
    INVENTORY,
    MIG_1,
    MIG_B1,
    MIG_B2,
    UUID_A,
    UUID_B,
    UUID_C,
)

CASES = [
    # (raw id, parsed fields, device it resolves to)
    (UUID_A, {"uuid": UUID_A}, GPU_A),
    (MIG_1, {"uuid": MIG_1}, MIG_B1),
    (f"{UUID_C}::3", {"uuid": UUID_C, "replica": 3}, GPU_C),
    (f"{UUID_C}::0", {"uuid": UUID_C, "replica": 0}, GPU_C),
    (f"{MIG_1}::1", {"uuid": MIG_1, "replica": 1}, MIG_B1),
    (
        f"MIG-{UUID_B}/2/0",
        {"uuid": UUID_B, "gpu_instance_id": 2, "compute_instance_id": 0},
        MIG_B2,
    ),
    ("nvidia0", {"index": 0}, GPU_A),
    ("nvidia3", {"index": 3}, GPU_D),
    ("nvidia1/gi1", {"index": 1, "gpu_instance_id": 1}, MIG_B1),
    ("nvidia1/gi2", {"index": 1, "gpu_instance_id": 2}, MIG_B2),
    ("nvidia2/vgpu5", {"index": 2, "replica": 5}, GPU_C),
    ("nvidia1/gi2/vgpu0", {"index": 1, "gpu_instance_id": 2, "replica": 0}, MIG_B2),
    (" " + UUID_A + " ", {"uuid": UUID_A}, GPU_A),
]


@pytest.mark.parametrize(("raw", "fields", "device"), CASES)
def test_parse_and_resolve(raw: str, fields: dict[str, object], device: object) -> None:
    ref = parse_device_id(raw)
    assert ref == DeviceRef(raw, **fields)  # type: ignore[arg-type]
    assert resolve(ref, INVENTORY) == device


@pytest.mark.parametrize(
    "raw", ["", "eth0", "0000:18:00.0", "nvidiactl", "nvidia0::1", "GPU-", "MIG-xyz", "gpu0"]
)
def test_other_ids_are_not_gpus(raw: str) -> None:
    assert parse_device_id(raw) is None


@pytest.mark.parametrize(
    "raw",
    ["GPU-eeeeeeee-0000-4000-8000-000000000000", "nvidia9", "nvidia0/gi1", "nvidia1/gi7"],
)
def test_ids_without_a_device_resolve_to_nothing(raw: str) -> None:
    ref = parse_device_id(raw)
    assert ref is not None
    assert resolve(ref, INVENTORY) is None


def test_schedulable_devices_are_mig_instances_and_gpus_not_in_mig_mode() -> None:
    assert schedulable(INVENTORY) == [GPU_A, MIG_B1, MIG_B2, GPU_C, GPU_D]
    assert GPU_B not in schedulable(INVENTORY)
