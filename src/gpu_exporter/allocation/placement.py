"""Where each holder's GPUs and CPUs sit: the placement snapshot the samples read.

Made once per allocation change (on a worker thread, with the topology read: docs/performance.md),
never per round: paths between GPUs and the kubelet's CPU assignments do not change while a pod
runs. A MIG instance or a replica counts as its GPU; a GPU in MIG mode is never among the free
ones (a pod cannot be given it whole), nor is one that any holder holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..devices import Device, DeviceId
from ..logs import RateLimitedLog
from ..nvml import DeviceCalls, ErrorCounter, SupportRegistry, WorkerPool
from ..topology.paths import (
    PathKind,
    Topology,
    memory_aligned_ratio,
    numa_aligned_ratio,
    placements,
)
from ..topology.read import read_topology
from .model import Allocations, PodKey
from .podresources import ContainerCpus
from .pool_jobs import PoolJob


@dataclass(frozen=True)
class PodPath:
    """The weakest path between a pod's GPUs, and the best the node had for as many."""

    namespace: str
    pod: str
    path: PathKind
    best: PathKind


@dataclass(frozen=True)
class NumaAlignment:
    """The share of a container's CPUs (``cpus``) and memory nodes (``memory``) on the NUMA node
    of the GPU it holds ``device`` on; None where the kubelet lists none or the GPU's is unknown."""

    device: DeviceId
    namespace: str
    pod: str
    container: str
    cpus: float | None
    memory: float | None


@dataclass(frozen=True)
class PlacementSnapshot:
    paths: tuple[PodPath, ...] = ()
    numa: tuple[NumaAlignment, ...] = ()


def place(
    topology: Topology,
    allocations: Allocations,
    cpus: Iterable[ContainerCpus],
    gpus: Sequence[DeviceId],
) -> PlacementSnapshot:
    """The placement of every holder of ``allocations`` on a node of whole GPUs ``gpus``."""
    holdings: dict[PodKey, set[str]] = {}
    for h in allocations.holdings:
        holdings.setdefault(h.pod_key, set()).add(_gpu_of(h.device))
    whole = {g.uuid for g in gpus if g.mig_mode != "enabled"}
    placed = placements(topology, holdings, whole | set().union(*holdings.values()))
    paths = tuple(
        PodPath(namespace, pod, found.path, found.best)
        for (namespace, pod), found in sorted(placed.items())
        # fewer than two GPUs: no path; a pair's path unknown: nothing guessed
        if found.path is not None and found.best is not None
    )
    assigned = {c.key: c for c in cpus}
    numa: list[NumaAlignment] = []
    seen: set[tuple[str, str, str, str]] = set()
    for h in allocations.holdings:
        container = assigned.get((h.namespace, h.pod, h.container))
        key = (h.device.uuid, h.namespace, h.pod, h.container)
        if container is None or key in seen:
            continue
        seen.add(key)
        gpu = _gpu_of(h.device)
        numa.append(
            NumaAlignment(
                h.device,
                h.namespace,
                h.pod,
                h.container,
                numa_aligned_ratio(container.cpu_ids, topology.local_cpus.get(gpu)),
                memory_aligned_ratio(container.memory_numa_nodes, topology.numa_nodes.get(gpu)),
            )
        )
    return PlacementSnapshot(paths, tuple(numa))


def _has_multi_gpu_pod(allocations: Allocations) -> bool:
    gpus: dict[PodKey, set[str]] = {}
    for h in allocations.holdings:
        gpus.setdefault(h.pod_key, set()).add(_gpu_of(h.device))
    return any(len(held) >= 2 for held in gpus.values())


def _gpu_of(device: DeviceId) -> str:
    return device.parent_uuid or device.uuid


class PlacementReader:
    """Reads the topology and places the holders (blocking: on a worker thread)."""

    def __init__(self, sysfs: Path | None, errors: ErrorCounter | None = None) -> None:
        self._sysfs = sysfs
        self._support = SupportRegistry()
        self._errors = errors or ErrorCounter()

    def __call__(
        self, devices: Sequence[Device], allocations: Allocations, cpus: Sequence[ContainerCpus]
    ) -> PlacementSnapshot:
        if not cpus and not _has_multi_gpu_pod(allocations):
            return PlacementSnapshot()  # nothing to place: no NVML call
        gpus = [d for d in devices if not d.id.is_mig]
        topology = read_topology(gpus, self._calls, self._sysfs)
        return place(topology, allocations, cpus, [g.id for g in gpus])

    def _calls(self, device: Device) -> DeviceCalls:
        return DeviceCalls(device.uuid, self._support, self._errors, collector="topology")


PlacementRead = Callable[
    [Sequence[Device], Allocations, Sequence[ContainerCpus]], PlacementSnapshot
]


class Placer:
    """Places the holders again when what a placement depends on changed: the holdings, the
    kubelet's CPU assignments, the devices' uuids and MIG modes (not the devices' other
    identity: their activity source changes when DCGM connects, say, which would read the
    topology again for nothing). The read runs on the worker pool as ``job``."""

    def __init__(self, read: PlacementRead, job: PoolJob, log: RateLimitedLog) -> None:
        self._read = read
        self._job = job
        self._log = log
        self._placed_from: object = None  # what the last placement was made from

    async def place(
        self,
        pool: WorkerPool,
        devices: Sequence[Device],
        allocations: Allocations,
        cpus: Sequence[ContainerCpus],
    ) -> PlacementSnapshot | None:
        """The new placement; None when nothing it depends on changed, or no read finished (a
        hung one is not started again beside it; a failed one is tried at the next call)."""
        if self._job.stuck:
            return None
        held = frozenset((h.device.uuid, *h.pod_key, h.container) for h in allocations.holdings)
        key = (held, tuple(cpus), tuple((d.uuid, d.id.mig_mode) for d in devices))
        if key == self._placed_from:
            return None
        try:
            placement = await self._job.run(pool, partial(self._read, devices, allocations, cpus))
        except Exception as exc:  # a GPU lost mid-read included: tried again at the next poll
            self._log.warning("placement-failed", "topology read failed", error=repr(exc))
            return None
        if placement is not None:
            self._placed_from = key
        return placement
