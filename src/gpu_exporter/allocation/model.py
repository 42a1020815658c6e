"""Who holds which device: a pod-resources snapshot resolved against the discovered devices."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..devices import DeviceId
from .ids import is_gpu_resource, parse_device_id, resolve, schedulable

if TYPE_CHECKING:  # grpc is imported only when the allocation subsystem is built
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

    @property
    def pod_key(self) -> PodKey:
        return (self.namespace, self.pod)


@dataclass
class Allocations:
    """Resolved allocations. ``unresolved`` holds GPU device ids that matched no device."""

    holdings: list[Holding] = field(default_factory=list)
    schedulable: list[DeviceId] = field(default_factory=list)
    unresolved: set[str] = field(default_factory=set)

    def pods_by_device(self) -> dict[str, set[PodKey]]:
        held: dict[str, set[PodKey]] = {}
        for holding in self.holdings:
            held.setdefault(holding.device.uuid, set()).add(holding.pod_key)
        return held

    def containers_of(self, uuid: str, pod: PodKey) -> set[str]:
        return {h.container for h in self.holdings if h.device.uuid == uuid and h.pod_key == pod}


def resolve_snapshot(snapshot: PodResourcesSnapshot, devices: Sequence[DeviceId]) -> Allocations:
    """Map every GPU device id onto a device; several replicas of one device collapse into it."""
    result = Allocations()
    seen: set[tuple[str, str, str, str, str]] = set()
    for entry in snapshot.containers:
        if not is_gpu_resource(entry.resource):
            continue
        for raw in entry.device_ids:
            device = _resolve(raw, devices)
            if device is None:
                result.unresolved.add(raw)
                continue
            key = (device.uuid, entry.namespace, entry.pod, entry.container, entry.resource)
            if key not in seen:
                seen.add(key)
                result.holdings.append(
                    Holding(device, entry.namespace, entry.pod, entry.container, entry.resource)
                )
    result.schedulable = _schedulable(snapshot, devices, result.holdings)
    return result


def _resolve(raw: str, devices: Sequence[DeviceId]) -> DeviceId | None:
    ref = parse_device_id(raw)
    return resolve(ref, devices) if ref is not None else None


def _schedulable(
    snapshot: PodResourcesSnapshot, devices: Sequence[DeviceId], holdings: Iterable[Holding]
) -> list[DeviceId]:
    """The kubelet's allocatable GPU devices; the inventory when it does not say."""
    chosen: dict[str, DeviceId] = {}
    for resource, raw in snapshot.allocatable or ():
        if is_gpu_resource(resource):
            device = _resolve(raw, devices)
            if device is not None:
                chosen[device.uuid] = device
    if not chosen:
        chosen = {d.uuid: d for d in schedulable(devices)}
    for holding in holdings:
        chosen.setdefault(holding.device.uuid, holding.device)
    return sorted(chosen.values(), key=lambda d: (d.index, d.gpu_instance_id or -1, d.uuid))
