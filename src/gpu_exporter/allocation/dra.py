"""DRA devices (pod-resources ``dynamic_resources``) resolved to the GPUs NVML discovered.

From the node alone, without the API server (reference/dra.md, "recommended mapping"): for each
device of driver ``gpu.nvidia.com``,

1. its CDI devices (:mod:`.cdi`) give ``/dev/nvidia<minor>``, the GPU with that NVML minor
   number, and for a MIG instance two ``nvidia-cap`` minors that ``mig-minors`` maps to
   (GPU minor, GPU instance, compute instance), the MIG instance NVML lists there;
2. when no readable spec defines them, the device name: ``gpu-<minor>`` (the *minor*, not the
   NVML index), ``gpu-<minor>-mig-<profile>-<gi profile id>-<placement start>`` (driver 25.12
   and later) and ``gpu-<minor>-mig-<gi profile id>-<start>-<size>`` (25.3, 25.8).

``compute-domain.nvidia.com`` devices are IMEX channels, not GPUs: skipped (and counted).
Everything here is pure and in memory; reading the spec files is :mod:`.cdi`'s job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..devices import DeviceId
from .cdi import CdiIndex, DeviceNodes

if TYPE_CHECKING:  # the client (h2) is imported only when the subsystem is built
    from .podresources import ClaimDevice

GPU_DRIVER = "gpu.nvidia.com"
COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"

# Why a DRA device of gpu.nvidia.com names no GPU (gpu_exporter_allocation_unresolved_total).
UNKNOWN_NAME = "unknown_device_name"  # no readable CDI spec, and a name the driver never makes
NO_SUCH_DEVICE = "no_such_device"  # a minor or MIG placement NVML does not have
MIG_MINORS = "mig_minors_unmapped"  # nvidia-cap minors that mig-minors does not list
VFIO = "vfio_passthrough"  # a GPU bound to vfio-pci for a VM: invisible to NVML
DRA_REASONS = (UNKNOWN_NAME, NO_SUCH_DEVICE, MIG_MINORS, VFIO)

_N = "[0-9]{1,6}"
_WHOLE = re.compile(rf"^gpu-(?P<minor>{_N})$")
_MIG = re.compile(rf"^gpu-(?P<minor>{_N})-mig-(?P<profile>.+)-(?P<gip>{_N})-(?P<start>{_N})$")
_OLD_MIG = re.compile(rf"^gpu-(?P<minor>{_N})-mig-(?P<gip>{_N})-(?P<start>{_N})-(?P<size>{_N})$")
_VFIO = re.compile(rf"^gpu-vfio-{_N}$")


@dataclass(frozen=True)
class Resolved:
    claim: ClaimDevice
    device: DeviceId


@dataclass(frozen=True)
class Unresolved:
    claim: ClaimDevice
    reason: str


@dataclass(frozen=True)
class DraResolution:
    resolved: tuple[Resolved, ...] = ()
    unresolved: tuple[Unresolved, ...] = ()
    compute_domain: int = 0  # IMEX channel devices skipped


def resolve_claims(
    claims: Iterable[ClaimDevice], devices: Sequence[DeviceId], index: CdiIndex
) -> DraResolution:
    resolved: list[Resolved] = []
    unresolved: list[Unresolved] = []
    compute_domain = 0
    for claim in claims:
        if claim.driver == COMPUTE_DOMAIN_DRIVER:
            compute_domain += 1
            continue
        if claim.driver != GPU_DRIVER:
            continue  # another vendor's or kind's device: not a GPU this exporter knows
        found = resolve_claim(claim, devices, index)
        if isinstance(found, DeviceId):
            resolved.append(Resolved(claim, found))
        else:
            unresolved.append(Unresolved(claim, found))
    return DraResolution(tuple(resolved), tuple(unresolved), compute_domain)


def resolve_claim(
    claim: ClaimDevice, devices: Sequence[DeviceId], index: CdiIndex
) -> DeviceId | str:
    """The device, or why there is none (one of :data:`DRA_REASONS`)."""
    if _VFIO.match(claim.device):
        return VFIO
    nodes = _cdi_nodes(claim, index)
    if nodes is not None:
        return _by_nodes(nodes, devices, index)
    return _by_name(claim.device, devices)


def _cdi_nodes(claim: ClaimDevice, index: CdiIndex) -> DeviceNodes | None:
    """The device nodes of this device's own CDI devices, if a readable spec defines them.

    The kubelet may list the CDI names of a claim's earlier devices with each later one (it
    accumulates them per driver), so only names ending in the device name count: the driver
    names its CDI devices ``<claim uid>-<device>`` (per-claim specs) or ``<device>`` (the node
    base spec of 25.3/25.8). A single CDI name is taken as the device's own.
    """
    names = [n for n in claim.cdi_devices if _names_device(n, claim.device)]
    if not names and len(claim.cdi_devices) == 1:
        names = list(claim.cdi_devices)
    gpus: list[int] = []
    caps: list[int] = []
    known = False
    for name in names:
        nodes = index.nodes(name)
        if nodes is not None:
            known = True
            gpus += nodes.gpu_minors
            caps += nodes.cap_minors
    if not known or not (gpus or caps):
        return None  # undefined, or a spec of edits only (sharing): ask the name
    return DeviceNodes(tuple(dict.fromkeys(gpus)), tuple(dict.fromkeys(caps)))


def _names_device(qualified: str, device: str) -> bool:
    _, _, name = qualified.partition("=")
    return bool(device) and (name == device or name.endswith("-" + device))


def _by_nodes(nodes: DeviceNodes, devices: Sequence[DeviceId], index: CdiIndex) -> DeviceId | str:
    if nodes.cap_minors:
        grants = [index.mig_minors.get(m) for m in nodes.cap_minors]
        if any(g is None for g in grants):
            return MIG_MINORS
        compute = [g for g in grants if g is not None and g.compute_instance is not None]
        if len(compute) != 1:
            return MIG_MINORS
        grant = compute[0]
        return _one(
            d
            for d in devices
            if d.is_mig
            and d.minor == grant.gpu_minor
            and d.gpu_instance_id == grant.gpu_instance
            and d.compute_instance_id == grant.compute_instance
        )
    if len(nodes.gpu_minors) != 1:
        return NO_SUCH_DEVICE
    return _one(d for d in devices if not d.is_mig and d.minor == nodes.gpu_minors[0])


def _by_name(name: str, devices: Sequence[DeviceId]) -> DeviceId | str:
    if whole := _WHOLE.match(name):
        minor = int(whole["minor"])
        return _one(d for d in devices if not d.is_mig and d.minor == minor)
    old = _OLD_MIG.match(name)
    if old:  # all numeric: 25.3/25.8 (the newer pattern would match it too)
        key = (int(old["gip"]), int(old["start"]), int(old["size"]))
        return _one(
            d for d in devices if d.is_mig and d.minor == int(old["minor"]) and d.placement == key
        )
    new = _MIG.match(name)
    if new and re.search("[a-z]", new["profile"]):
        return _by_new_mig_name(new, devices)
    return UNKNOWN_NAME


def _by_new_mig_name(name: re.Match[str], devices: Sequence[DeviceId]) -> DeviceId | str:
    """Placement decides; where NVML would not say it (GPU instance info needs privileges the
    exporter may lack), the profile does if only one instance of it is on that GPU."""
    minor, wanted = int(name["minor"]), (int(name["gip"]), int(name["start"]))
    profile = name["profile"]
    candidates = [
        d
        for d in devices
        if d.is_mig
        and d.minor == minor
        and (not d.mig_profile or canonical_profile(d.mig_profile) == profile)
    ]
    placed = [d for d in candidates if d.placement is not None]
    if placed:
        return _one(d for d in placed if d.placement is not None and d.placement[:2] == wanted)
    return _one(d for d in candidates if d.mig_profile)


def canonical_profile(profile: str) -> str:
    """A MIG profile as the driver writes it into device names: ``1g.10gb+me`` -> ``1g10gb-me``."""
    return profile.lower().replace(".", "").replace("+", "-")


def _one(candidates: Iterable[DeviceId]) -> DeviceId | str:
    found = list(candidates)
    return found[0] if len(found) == 1 else NO_SUCH_DEVICE
