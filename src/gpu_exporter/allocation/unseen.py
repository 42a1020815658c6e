"""GPU use the allocator never sees: each GPU process classed against who holds its device.

Every process a device lists (NVML, :mod:`.processes`) is one of:

- ``held``: its pod holds this device through pod-resources (a device plugin) or DRA;
- ``not_held``: a pod the kubelet lists, holding no allocation of this device (no GPU request and
  ``NVIDIA_VISIBLE_DEVICES=all``, a privileged or debugging pod, the pods of a fractional
  scheduler whose reservation pod holds the device);
- ``no_pod``: its cgroup names no pod (a host or system process, a job run over SSH);
- ``gone``: its cgroup names a pod UID the kubelet does not list (no pod log directory names
  the UID, or the pod it names is not in the List answer): a zombie of a deleted pod.

A ``not_held`` pod becomes a holder with ``source="process"`` (:func:`observed_holdings`), so
idle accounting, cost and right-sizing see it, and the device's real holder, now sharing it, is
classified by its own processes' activity. ``no_pod`` and ``gone`` are summed per device without
a pod (:class:`UnattributedMemory`, and the activity owners :func:`unattributed_owner`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..devices import DeviceId
from .cgroups import PodName
from .model import Holding, PodKey
from .processes import OwnedProcess

HELD = "held"
NOT_HELD = "not_held"
NO_POD = "no_pod"
GONE = "gone"
CLASSES = (HELD, NOT_HELD, NO_POD, GONE)
UNATTRIBUTED = (NO_POD, GONE)
PROCESS_RESOURCE = ""  # the resource label of a holding seen through its processes only


@dataclass(frozen=True)
class ClassifiedProcess:
    process: OwnedProcess
    process_class: str
    pod: PodKey | None = None  # held and not_held: the pod; gone: the names a log dir gave, if any
    container: str = ""

    @property
    def device(self) -> DeviceId:
        return self.process.device


def classify(
    process: OwnedProcess,
    names: Mapping[str, PodName],
    listed: frozenset[PodKey],
    held: frozenset[tuple[str, PodKey]] | None,
) -> tuple[str, PodKey | None]:
    """The class of one process and its pod: ``names`` maps pod UIDs to names (the pod log
    directories), ``listed`` the pods the kubelet lists, ``held`` (device uuid, pod) holdings;
    None while the kubelet has not answered: no pod is said to hold nothing on its word."""
    if process.owner is None:
        return NO_POD, None
    pod_name = names.get(process.owner.pod_uid)
    if pod_name is None:
        return GONE, None
    pod = (pod_name.namespace, pod_name.pod)
    if pod not in listed:
        return GONE, pod
    if held is None or (process.device.uuid, pod) in held:
        return HELD, pod
    return NOT_HELD, pod


def observed_holdings(processes: Iterable[ClassifiedProcess]) -> list[Holding]:
    """One ``source="process"`` holding per (device, pod, container) a ``not_held`` process
    runs in, in the order first seen."""
    seen: dict[tuple[str, str, str, str], Holding] = {}
    for p in processes:
        if p.process_class != NOT_HELD or p.pod is None:
            continue
        key = (p.device.uuid, *p.pod, p.container)
        if key not in seen:
            seen[key] = Holding(p.device, *p.pod, p.container, PROCESS_RESOURCE, observed=True)
    return list(seen.values())


def unattributed_owner(process_class: str) -> tuple[str, str, str]:
    """The activity owner (namespace, pod, container) that stands for every process of an
    unattributed class on a device: no pod, the class in the container's place."""
    return ("", "", process_class)


class UnattributedMemory:
    """Device memory of ``no_pod`` and ``gone`` processes per device, from the last scan."""

    def __init__(self) -> None:
        self.used: dict[tuple[DeviceId, str], int] = {}

    def update(self, processes: Iterable[ClassifiedProcess]) -> None:
        used: dict[tuple[DeviceId, str], int] = {}
        for p in processes:
            if p.process_class in UNATTRIBUTED and p.process.used_bytes:
                key = (p.device, p.process_class)
                used[key] = used.get(key, 0) + p.process.used_bytes
        self.used = used
