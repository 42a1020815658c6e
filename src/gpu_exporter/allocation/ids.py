"""Device ids as kubelet device plugins report them, and the devices they name.

The NVIDIA device plugin and GKE's plugin name the same hardware in several ways
(``reference/kubernetes.md``):

- ``GPU-<uuid>``: a whole GPU;
- ``MIG-<uuid>``: a MIG instance ("single" and "mixed" strategies alike);
- ``MIG-GPU-<uuid>/<gi>/<ci>``: a MIG instance on drivers before R470;
- ``<id>::<n>``: replica ``n`` of a time-sliced or MPS-shared device (any of the above);
- ``nvidia<N>``, ``nvidia<N>/gi<M>``, ``nvidia<N>/vgpu<K>`` (GKE): index based.

Parsing is pure; :func:`resolve` maps a parsed id onto the devices NVML discovered.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..devices import DeviceId

# Numbers are ASCII and short: \d would take any Unicode digit, and int() refuses 4300+ digits.
_N = "[0-9]{1,9}"
_REPLICA = re.compile(rf"^(?P<base>.+)::(?P<replica>{_N})$")
_LEGACY_MIG = re.compile(rf"^MIG-(?P<parent>GPU-[0-9A-Fa-f-]+)/(?P<gi>{_N})/(?P<ci>{_N})$")
_UUID = re.compile(r"^(?P<kind>GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f-]*$")
_GKE = re.compile(rf"^nvidia(?P<index>{_N})(?:/gi(?P<gi>{_N}))?(?:/vgpu(?P<vgpu>{_N}))?$")
# Device plugins the exporter accounts for; other resources (NICs, FPGAs) are ignored.
GPU_RESOURCE_PREFIX = "nvidia.com/"


@dataclass(frozen=True)
class DeviceRef:
    """What a device id names: a UUID, or (GKE) an index; plus the MIG and replica parts."""

    raw: str
    uuid: str | None = None  # GPU-... or MIG-...; the parent's GPU-... for legacy MIG ids
    index: int | None = None  # GKE: the NVML index
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    replica: int | None = None  # time-slicing / MPS replica, or GKE's vgpu number

    @property
    def shared(self) -> bool:
        return self.replica is not None


def parse_device_id(raw: str) -> DeviceRef | None:
    """Parse one id; None when it is no form an NVIDIA GPU plugin produces."""
    text = raw.strip()
    replica: int | None = None
    match = _REPLICA.match(text)
    if match:
        text, replica = match["base"], int(match["replica"])
    legacy = _LEGACY_MIG.match(text)
    if legacy:
        return DeviceRef(
            raw,
            uuid=legacy["parent"],
            gpu_instance_id=int(legacy["gi"]),
            compute_instance_id=int(legacy["ci"]),
            replica=replica,
        )
    if _UUID.match(text):
        return DeviceRef(raw, uuid=text, replica=replica)
    gke = _GKE.match(text)
    if gke and replica is None:
        gi, vgpu = gke["gi"], gke["vgpu"]
        return DeviceRef(
            raw,
            index=int(gke["index"]),
            gpu_instance_id=int(gi) if gi is not None else None,
            replica=int(vgpu) if vgpu is not None else None,
        )
    return None


def resolve(ref: DeviceRef, devices: Iterable[DeviceId]) -> DeviceId | None:
    """The schedulable device (a whole GPU or a MIG instance) ``ref`` names, if present."""
    for device in devices:
        if _matches(ref, device):
            return device
    return None


def _matches(ref: DeviceRef, device: DeviceId) -> bool:
    if ref.uuid is not None and ref.gpu_instance_id is None:
        return device.uuid == ref.uuid
    if ref.uuid is not None:  # legacy MIG-GPU-<uuid>/<gi>/<ci>
        return (
            device.parent_uuid == ref.uuid
            and device.gpu_instance_id == ref.gpu_instance_id
            and ref.compute_instance_id in (None, device.compute_instance_id)
        )
    if ref.index != device.index:
        return False
    if ref.gpu_instance_id is None:
        return not device.is_mig
    return device.is_mig and device.gpu_instance_id == ref.gpu_instance_id


def is_gpu_resource(resource_name: str) -> bool:
    return resource_name.startswith(GPU_RESOURCE_PREFIX)


def schedulable(devices: Iterable[DeviceId]) -> list[DeviceId]:
    """Devices a pod can be given: MIG instances, and whole GPUs not in MIG mode."""
    return [d for d in devices if d.is_mig or d.mig_mode != "enabled"]
