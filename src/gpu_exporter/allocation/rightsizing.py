"""Right-sizing: would this whole-GPU allocation fit a MIG slice?

For each allocation (a pod holding a device) the peak framebuffer of the pod's processes on the
device since the allocation began (``gpu_allocation_memory_peak_bytes``), and, for a whole GPU
held by one pod on a MIG-capable model, the smallest GPU-instance profile that would hold it
(``gpu_allocation_smallest_fitting_profile_info{profile}`` 1; ``whole_gpu`` when none would):

- memory: the profile's memory holds the peak with 10% headroom;
- compute: the profile's compute fraction (slices / the GPU's slices) is at least the p95 of
  the allocation's SM activity over its life. The full-GPU profile (7g) never counts as a fit:
  moving to it frees nothing.

Activity comes from the ActivityLedger the collectors fill (SM activity, else NVML utilisation,
which over-reports and so never claims a fit it should not), time-weighted into a fixed
28-bucket histogram per allocation (bucket edges k/28: every profile fraction of a 7- or 4-slice
GPU is an edge, so "p95 <= fraction" is decided exactly). The peak comes from the process scans
(NVML reports current usage only: a peak shorter than the scan interval can be missed).

State is in memory, per exporter lifetime (docs/allocation.md "Right-sizing" says why); a
released allocation is forgotten at once. Cost: 28 floats and a few fields per allocation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ..devices import DeviceId
from ..exposition import Family, Sample, gauge
from ..ledger import ActivityKind, ActivityLedger, ActivityPoint, interval_between
from ..migprofiles import MigProfileBook, ProfileTable
from .metrics import fit_labels, fraction_labels, holder_labels
from .model import PodKey

MEMORY_PEAK = gauge(
    "gpu_allocation_memory_peak_bytes",
    "Peak device memory of the pod's processes on the device since the allocation began "
    "(since the exporter started, if later).",
)
SMALLEST_FIT = gauge(
    "gpu_allocation_smallest_fitting_profile_info",
    "1 for the smallest MIG profile that would hold this whole-GPU allocation (memory peak + 10%, "
    'SM activity p95); profile="whole_gpu" when none would.',
)
COMPUTE_FRACTION = gauge(
    "gpu_mig_profile_compute_fraction",
    "Share of the GPU's compute slices a MIG GPU-instance profile has (2g on a 7-slice GPU: 2/7), "
    "per GPU model on the node (whether or not MIG mode is on).",
)
FAMILIES: tuple[Family, ...] = (MEMORY_PEAK, SMALLEST_FIT, COMPUTE_FRACTION)

WHOLE_GPU = "whole_gpu"
HEADROOM = 1.1
QUANTILE = 0.95
BUCKETS = 28  # edges k/28: exact for the slice fractions of 7- and 4-slice GPUs


class ActivityHistogram:
    """Seconds spent at each activity level, in buckets ``((k-1)/28, k/28]`` (0 in the first)."""

    def __init__(self) -> None:
        self.seconds = [0.0] * BUCKETS

    def add(self, ratio: float, seconds: float) -> None:
        if seconds <= 0:
            return
        bucket = min(BUCKETS, max(1, math.ceil(round(ratio * BUCKETS, 9))))
        self.seconds[bucket - 1] += seconds

    def quantile_edge(self, q: float = QUANTILE) -> float | None:
        return quantile_edge(self.seconds, q)


def quantile_edge(buckets: Sequence[float], q: float = QUANTILE) -> float | None:
    """The smallest edge at or below which a fraction ``q`` of the time lies; None if empty.

    The true quantile is at most this edge, so a profile fraction that is an edge covers the
    quantile exactly when it is at least the edge.
    """
    total = sum(buckets)
    if total <= 0:
        return None
    running = 0.0
    for k, seconds in enumerate(buckets, start=1):
        running += seconds
        if running >= q * total * (1 - 1e-12):
            return k / BUCKETS
    return 1.0


def smallest_fit(table: ProfileTable, peak_bytes: int, activity_p95: float) -> str:
    """The smallest profile (fewest slices, then least memory) holding the allocation."""
    fits = [
        p
        for p in table.profiles
        if p.slices < table.total_slices
        and p.memory_mib * 2**20 >= peak_bytes * HEADROOM
        and table.compute_fraction(p) >= activity_p95 - 1e-9
    ]
    if not fits:
        return WHOLE_GPU
    return min(fits, key=lambda p: (p.slices, p.memory_mib, p.name)).name


@dataclass
class _Tenure:
    device: DeviceId
    since: float  # monotonic time it was first seen
    peak: int | None = None
    activity: ActivityHistogram = field(default_factory=ActivityHistogram)
    reading: _PeakReading | None = None  # the last one published


@dataclass
class _Signal:
    kind: ActivityKind
    point: ActivityPoint


class RightSizer:
    """Peak memory and SM-activity histogram per allocation; the fit, rendered as samples."""

    def __init__(self, ledger: ActivityLedger, profiles: MigProfileBook) -> None:
        self._ledger = ledger
        self._profiles = profiles
        self._tenures: dict[tuple[str, PodKey], _Tenure] = {}
        self._signals: dict[str, _Signal] = {}
        self._reading = RightSizing()

    def update(self, now: float, held: Mapping[DeviceId, set[PodKey]]) -> None:
        """Follow the current holders; credit each device's new activity to its sole holder."""
        current: set[tuple[str, PodKey]] = set()
        for device, pods in held.items():
            for pod in pods:
                key = (device.uuid, pod)
                current.add(key)
                tenure = self._tenures.get(key)
                if tenure is None:
                    tenure = self._tenures[key] = _Tenure(device, since=now)
                tenure.device = device
            interval = self._next_interval(device.uuid)
            if interval is not None and len(pods) == 1 and not device.is_mig:
                start, end, mean = interval
                tenure = self._tenures[(device.uuid, next(iter(pods)))]
                tenure.activity.add(mean, end - max(start, tenure.since))
        for key in set(self._tenures) - current:
            del self._tenures[key]  # released: forgotten at once
        for uuid in set(self._signals) - {d.uuid for d in held}:
            del self._signals[uuid]

    def observe_memory(
        self, used: Mapping[tuple[DeviceId, str, str, str], list[int | None]]
    ) -> None:
        """A process scan's memory per (device, namespace, pod, container): raise the peaks."""
        totals: dict[tuple[str, PodKey], int] = {}
        for (device, namespace, pod, _container), values in used.items():
            known = [v for v in values if v is not None]
            if known:
                key = (device.uuid, (namespace, pod))
                totals[key] = totals.get(key, 0) + sum(known)
        for key, total in totals.items():
            tenure = self._tenures.get(key)
            if tenure is not None:
                tenure.peak = total if tenure.peak is None else max(tenure.peak, total)

    def reading(self) -> RightSizing:
        """Peaks and what a fit is made from, as they are now (frozen).

        A reading lives until the next round's, long enough for the garbage collector to move
        it to its old generation: one equal to the last (a MIG instance's, until a scan raises
        its peak) is the last one, not a new one each round."""
        shared = _shared(self._tenures)
        holders = []
        for (uuid, (namespace, pod)), tenure in self._tenures.items():
            if tenure.peak is None:
                continue  # no scan has seen its processes yet
            fits = uuid not in shared and not tenure.device.is_mig
            table = self._profiles.table(uuid) if fits else None
            activity = tuple(tenure.activity.seconds) if table is not None else ()
            holder = _PeakReading(tenure.device, namespace, pod, tenure.peak, table, activity)
            if tenure.reading is None or tenure.reading != holder:
                tenure.reading = holder
            holders.append(tenure.reading)
        reading = RightSizing(tuple(holders), tuple(self._profiles.compute_fractions().items()))
        if reading != self._reading:
            self._reading = reading
        return self._reading

    def samples(self) -> Iterator[Sample]:
        return self.reading().samples()

    def _next_interval(self, uuid: str) -> tuple[float, float, float] | None:
        """The device's activity interval since the last one consumed, with its mean ratio."""
        signal = self._signals.get(uuid)
        kinds = (signal.kind,) if signal else (ActivityKind.SM_ACTIVE, ActivityKind.UTILIZATION)
        for kind in kinds:
            point = self._ledger.latest(uuid, kind)
            if point is None:
                continue
            if signal is None:
                self._signals[uuid] = _Signal(kind, point)
                return None  # a first point
            previous, signal.point = signal.point, point
            return interval_between(previous, point)
        return None


class _PeakReading(NamedTuple):
    device: DeviceId
    namespace: str
    pod: str
    peak: int
    table: ProfileTable | None  # None: no fit (a MIG instance, a shared or not MIG-capable GPU)
    activity: tuple[float, ...]  # the activity histogram's seconds, where a fit is made

    def fit(self) -> str | None:
        p95 = quantile_edge(self.activity) if self.table is not None else None
        if self.table is None or p95 is None:
            return None  # not MIG-capable, or no activity seen yet
        return smallest_fit(self.table, self.peak, p95)


@dataclass(frozen=True)
class RightSizing:
    """Peaks and fits as of one accounting round, frozen: the fit is worked out when the
    samples are read (a render), not every round."""

    holders: tuple[_PeakReading, ...] = ()
    fractions: tuple[tuple[tuple[str, str], float], ...] = ()

    def samples(self) -> Iterator[Sample]:
        for h in self.holders:
            labels = holder_labels(h.device.labels, h.namespace, h.pod)
            yield Sample(MEMORY_PEAK, labels, float(h.peak))
            fit = h.fit()
            if fit is not None:
                yield Sample(SMALLEST_FIT, fit_labels(labels, fit), 1)
        for (model, profile), fraction in self.fractions:
            yield Sample(COMPUTE_FRACTION, fraction_labels(model, profile), fraction)


def _shared(tenures: Mapping[tuple[str, PodKey], _Tenure]) -> set[str]:
    """Devices more than one pod holds (time-sliced, MPS): no fit for any of them."""
    seen: set[str] = set()
    shared: set[str] = set()
    for uuid, _ in tenures:
        (shared if uuid in seen else seen).add(uuid)
    return shared
