"""The allocation subsystem's series, built from its state on the event loop, each part when
what it shows changed (the time counters after each accounting round)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ..devices import DeviceId
from ..exposition import Sample, label_string
from ..ledger import SM_BANDS
from .accounting import UsageReading
from .dra import DRA_REASONS
from .jobgpus import JobHolding
from .metrics import (
    ALLOCATED,
    ALLOCATED_IDLE_SECONDS,
    ALLOCATED_SECONDS,
    ALLOCATION_INFO,
    CONTAINER_MEMORY,
    CONTAINER_MEMORY_BANDWIDTH,
    CONTAINER_SM_ACTIVE,
    CONTAINER_SM_ACTIVE_SECONDS,
    IDLE_STREAK,
    MEMORY_NUMA_ALIGNED,
    NUMA_ALIGNED,
    PATH_INFO,
    SHARING_INFO,
    SLURM_JOB_INFO,
    SM_BAND_SECONDS,
    UNATTRIBUTED_MEMORY,
    UNATTRIBUTED_SM_ACTIVE_SECONDS,
    UNRESOLVED,
    band_labels,
    class_labels,
    holder_labels,
    info_labels,
    mode_labels,
    slurm_job_labels,
)
from .model import Allocations, Holding
from .placement import PlacementSnapshot
from .process_activity import ContainerActivity
from .rightsizing import RightSizing
from .sharing import sharing_modes
from .unseen import UNATTRIBUTED, UnattributedMemory, unattributed_owner

# gpu_exporter_allocation_unresolved_total's reasons: a device-plugin id, or a DRA device.
UNKNOWN_DEVICE_ID = "unknown_device_id"
UNRESOLVED_REASONS = (UNKNOWN_DEVICE_ID, *DRA_REASONS)


class UnresolvedCounts:
    """gpu_exporter_allocation_unresolved_total: a key counts when it appears, not per poll."""

    def __init__(self) -> None:
        self._totals = dict.fromkeys(UNRESOLVED_REASONS, 0)
        self._current: set[tuple[str, str]] = set()

    def observe(self, keys: set[tuple[str, str]]) -> None:
        for reason, _ in keys - self._current:
            self._totals[reason] = self._totals.get(reason, 0) + 1
        self._current = keys

    def samples(self) -> Iterable[Sample]:
        for reason, total in self._totals.items():
            yield Sample(UNRESOLVED, label_string({"reason": reason}), float(total))


# (device labels, namespace, pod[, container]) -> labels: holder_labels, or job_labels
HolderLabels = Callable[..., str]


def renewed(previous: tuple[Sample, ...], samples: Iterable[Sample]) -> tuple[Sample, ...]:
    """``samples``, or ``previous`` where they are the same series with the same values.

    A published part lives for many rounds, long enough for the garbage collector to move it to
    its old generation: rebuilding an equal one at every scan or round would fill that
    generation with nothing new (and bring on the full collections that stall the event loop).
    """
    fresh = tuple(samples)
    return previous if fresh == previous else fresh


def holding_samples(
    allocations: Allocations, observed: Iterable[Holding] = (), *, info: bool = True
) -> Iterable[Sample]:
    """Who holds what (``observed``: pods seen only through their processes; ``info`` False
    on a Slurm node, whose holders :func:`job_info_samples` tells instead of
    gpu_allocation_info), and the schedulable devices."""
    held = allocations.pods_by_device()
    for h in (*allocations.holdings, *observed) if info else ():
        labels = info_labels(h.device.labels, h.namespace, h.pod, h.container, h.resource, h.source)
        yield Sample(ALLOCATION_INFO, labels, 1)
    for device in allocations.schedulable:
        yield Sample(ALLOCATED, device.labels, 1.0 if held.get(device.uuid) else 0.0)


def accounting_samples(
    usages: Iterable[UsageReading], holder: HolderLabels = holder_labels
) -> Iterable[Sample]:
    """The time counters of every holder (``holder`` labels them: :func:`~.metrics.job_labels`
    on a Slurm node)."""
    for device_labels, (namespace, pod), allocated, idle, streak, bands in usages:
        labels = holder(device_labels, namespace, pod)
        yield Sample(ALLOCATED_SECONDS, labels, allocated)
        if idle is not None:
            yield Sample(ALLOCATED_IDLE_SECONDS, labels, idle)
            if streak is not None:
                yield Sample(IDLE_STREAK, labels, streak)
        if bands is not None:
            for band, seconds in zip(SM_BANDS, bands, strict=True):
                yield Sample(SM_BAND_SECONDS, band_labels(labels, band), seconds)


@dataclass(frozen=True)
class AccountingSeries:
    """The time counters and right-sizing as of one accounting round, frozen: their samples
    are built when a render first reads them, not every round (a MIG node's holders make
    hundreds of them)."""

    usages: tuple[UsageReading, ...] = ()
    rightsizing: RightSizing = field(default_factory=RightSizing)
    holder: HolderLabels = holder_labels

    def samples(self) -> Iterator[Sample]:
        yield from accounting_samples(self.usages, self.holder)
        yield from self.rightsizing.samples()


def job_info_samples(holdings: Iterable[JobHolding]) -> Iterable[Sample]:
    """gpu_slurm_job_info: one series per job and GPU it holds."""
    for h in holdings:
        job = h.job
        labels = slurm_job_labels(h.device.labels, job.job_id, job.user, job.account, job.partition)
        yield Sample(SLURM_JOB_INFO, labels, 1)


def sharing_samples(
    gpus: Sequence[DeviceId],
    allocations: Allocations,
    mps: set[str],
    compute_modes: Mapping[str, int],
) -> Iterable[Sample]:
    """gpu_sharing_info of each whole GPU (MIG instances are not listed)."""
    modes = sharing_modes(
        gpus, allocations.pods_by_device(), allocations.replicated, mps, compute_modes
    )
    for gpu, mode in modes.items():
        yield Sample(SHARING_INFO, mode_labels(gpu.labels, mode), 1)


def placement_samples(placement: PlacementSnapshot, allocations: Allocations) -> Iterable[Sample]:
    """Paths and NUMA alignment of the pods that hold devices now (a placement read after a
    change may still be on its way: a pod gone since is not shown)."""
    holders = {h.pod_key for h in allocations.holdings}
    for p in placement.paths:
        if (p.namespace, p.pod) in holders:
            path = {"namespace": p.namespace, "pod": p.pod}
            path |= {"path": p.path.label, "best_path": p.best.label}
            yield Sample(PATH_INFO, label_string(path), 1)
    for n in placement.numa:
        if (n.namespace, n.pod) not in holders:
            continue
        labels = holder_labels(n.device.labels, n.namespace, n.pod, n.container)
        if n.cpus is not None:
            yield Sample(NUMA_ALIGNED, labels, n.cpus)
        if n.memory is not None:
            yield Sample(MEMORY_NUMA_ALIGNED, labels, n.memory)


def activity_samples(
    activity: ContainerActivity, holder: HolderLabels = holder_labels
) -> Iterable[Sample]:
    unattributed = {unattributed_owner(c) for c in UNATTRIBUTED}
    for owner in activity.owners():
        if owner.owner in unattributed:
            continue  # published per class (unattributed_samples)
        labels = holder(owner.device.labels, *owner.owner)
        yield Sample(CONTAINER_SM_ACTIVE, labels, owner.sm_ratio)
        yield Sample(CONTAINER_SM_ACTIVE_SECONDS, labels, owner.sm_seconds)
        yield Sample(CONTAINER_MEMORY_BANDWIDTH, labels, owner.memory_ratio)


def memory_samples(
    memory: Mapping[tuple[DeviceId, str, str, str], list[int | None]],
    holder: HolderLabels = holder_labels,
) -> Iterable[Sample]:
    for (device, namespace, pod, container), used in memory.items():
        known = [u for u in used if u is not None]
        if not known:
            continue  # the driver could not say: withhold rather than report 0
        labels = holder(device.labels, namespace, pod, container)
        yield Sample(CONTAINER_MEMORY, labels, float(sum(known)))


def unattributed_samples(
    devices: Sequence[DeviceId], memory: UnattributedMemory, activity: ContainerActivity
) -> Iterable[Sample]:
    """Memory of processes of no pod or of a gone pod while non-zero; their SM-active seconds
    for every device from the start (a counter must exist before it first rises, for
    ``increase()``): two series per device."""
    for (device, process_class), used in memory.used.items():
        yield Sample(UNATTRIBUTED_MEMORY, class_labels(device.labels, process_class), float(used))
    seconds = {(a.device.uuid, a.owner): a.sm_seconds for a in activity.owners()}
    for device in devices:
        if activity.until(device.uuid) is None:
            continue  # no per-process utilisation read yet (or none at all): unknown, not zero
        for process_class in UNATTRIBUTED:
            total = seconds.get((device.uuid, unattributed_owner(process_class)), 0.0)
            labels = class_labels(device.labels, process_class)
            yield Sample(UNATTRIBUTED_SM_ACTIVE_SECONDS, labels, total)
