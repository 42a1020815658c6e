"""Who holds which device: a pod-resources snapshot resolved against the discovered devices.

Device-plugin ids (:mod:`.ids`) and DRA claims (:mod:`.dra`) become the same :class:`Holding`s,
so every series, the idle accounting, the holder history and attribution treat them alike. A
DRA holding's ``resource`` is ``dra:<claim namespace>/<claim name>`` (docs/allocation.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..devices import DeviceId
from .cdi import CdiIndex
from .dra import GPU_DRIVER, Unresolved, resolve_claims
from .ids import is_gpu_resource, parse_device_id, resolve, schedulable

if TYPE_CHECKING:  # the client (h2) is imported only when the subsystem is built
    from .podresources import PodResourcesSnapshot

PodKey = tuple[str, str]  # (namespace, pod)


@dataclass(frozen=True)
class Holding:
    """One container holding one device (through one of its device ids)."""

    device: DeviceId
    namespace: str
    pod: str
    container: str
    resource: str
    claim: tuple[str, str] | None = None  # DRA: (claim namespace, claim name)
    # Seen only through the pod's processes on the device: it holds no allocation of it
    # (allocation/unseen.py); never part of a resolved snapshot.
    observed: bool = False

    @property
    def pod_key(self) -> PodKey:
        return (self.namespace, self.pod)

    @property
    def source(self) -> str:
        """gpu_allocation_info's ``source``: how the holding is known (docs/allocation.md)."""
        if self.observed:
            return "process"
        return "pod-resources" if self.claim is None else "dra"


def dra_resource(claim_namespace: str, claim_name: str) -> str:
    """The ``resource`` label of a device held through a DRA ResourceClaim."""
    return f"dra:{claim_namespace}/{claim_name}"


@dataclass
class Allocations:
    """Resolved allocations. ``unresolved`` holds GPU device ids that matched no device;
    ``unresolved_claims`` the gpu.nvidia.com DRA devices that did not, with the reason."""

    holdings: list[Holding] = field(default_factory=list)
    schedulable: list[DeviceId] = field(default_factory=list)
    unresolved: set[str] = field(default_factory=set)
    unresolved_claims: list[Unresolved] = field(default_factory=list)
    compute_domain_devices: int = 0  # IMEX channels held through DRA (not GPUs: skipped)
    replicated: set[str] = field(default_factory=set)  # uuids held through replica ids (::n)

    def pods_by_device(self) -> dict[str, set[PodKey]]:
        held: dict[str, set[PodKey]] = {}
        for holding in self.holdings:
            held.setdefault(holding.device.uuid, set()).add(holding.pod_key)
        return held


def resolve_snapshot(
    snapshot: PodResourcesSnapshot,
    devices: Sequence[DeviceId],
    cdi: CdiIndex | None = None,
    *,
    exclude: PodKey | None = None,
) -> Allocations:
    """Map every GPU device id and DRA device onto a device; several replicas of one device
    collapse into it. ``exclude`` is a pod whose holdings do not count (the exporter's own)."""
    result = Allocations()
    seen: set[tuple[str, str, str, str, str]] = set()

    def hold(holding: Holding) -> None:
        key = (holding.device.uuid, *holding.pod_key, holding.container, holding.resource)
        if key not in seen:
            seen.add(key)
            result.holdings.append(holding)

    for entry in snapshot.containers:
        if not is_gpu_resource(entry.resource) or (entry.namespace, entry.pod) == exclude:
            continue
        for raw in entry.device_ids:
            device = _resolve(raw, devices)
            if device is None:
                result.unresolved.add(raw)
                continue
            ref = parse_device_id(raw)
            if ref is not None and ref.shared:
                result.replicated.add(device.uuid)
            hold(Holding(device, entry.namespace, entry.pod, entry.container, entry.resource))
    claims = [c for c in snapshot.claims if (c.namespace, c.pod) != exclude]
    dra = resolve_claims(claims, devices, cdi or CdiIndex())
    for found in dra.resolved:
        c = found.claim
        claim = (c.claim_namespace, c.claim_name)
        hold(Holding(found.device, c.namespace, c.pod, c.container, dra_resource(*claim), claim))
    result.unresolved_claims = list(dra.unresolved)
    result.compute_domain_devices = dra.compute_domain
    with_dra = any(c.driver == GPU_DRIVER for c in snapshot.claims)
    result.schedulable = _schedulable(snapshot, devices, result.holdings, with_dra)
    return result


def _resolve(raw: str, devices: Sequence[DeviceId]) -> DeviceId | None:
    ref = parse_device_id(raw)
    return resolve(ref, devices) if ref is not None else None


def _schedulable(
    snapshot: PodResourcesSnapshot,
    devices: Sequence[DeviceId],
    holdings: Iterable[Holding],
    with_dra: bool,
) -> list[DeviceId]:
    """The kubelet's allocatable GPU devices; the inventory when it does not say, or when a DRA
    driver hands out GPUs (GetAllocatableResources never lists DRA devices)."""
    chosen: dict[str, DeviceId] = {}
    for resource, raw in snapshot.allocatable or ():
        if is_gpu_resource(resource):
            device = _resolve(raw, devices)
            if device is not None:
                chosen[device.uuid] = device
    if not chosen or with_dra:
        chosen.update((d.uuid, d) for d in schedulable(devices))
    for holding in holdings:
        chosen.setdefault(holding.device.uuid, holding.device)
    return sorted(chosen.values(), key=lambda d: (d.index, d.gpu_instance_id or -1, d.uuid))
