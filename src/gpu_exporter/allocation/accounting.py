"""Allocated and idle-allocated time per (device, pod), from the activity ledger.

Every update adds the time since the previous update to each holder's allocated seconds. Idle
time comes from the ledger's activity integrals: each new ledger interval ``[a, b]`` has the exact
mean activity ``delta(seconds_total) / (b - a)``; when it is below the threshold, the part of
``[a, b]`` during which a pod held the device counts as idle for that pod. So the idle counter
follows the sampler's own intervals exactly, whatever the update cadence, and never exceeds the
allocated counter.

A *shared* device (several pods hold it, or it was allocated through time-slicing/MPS replica
ids) where per-process activity is sampled is classified per pod instead: a pod is idle when its
own processes' SM share (NVML per-process utilisation, "a kernel was resident", summed over its
containers; see :mod:`.process_activity`) is below the threshold over the interval since its
previous classification. Without per-process samples a shared device keeps the device rule: every
pod on it accrues idle time together, and none while another pod keeps it busy.

The signal is SM activity (GPM) where the device has it, else NVML utilisation ("a kernel was
resident", which over-reports activity, so under-reports idle). A device with neither (a MIG
instance without GPM) accrues allocated time only and publishes no idle series.

The same intervals, where the signal is SM activity and the device rule classifies them, also
credit the holder's SM activity bands (``ledger.sm_band``, as the per-GPU band counters judge the
same intervals): a holder that idles between bursts splits between high and low, one that runs
small kernels steadily sits in mid, whatever their means. A holder classified by its own
processes' share (a shared device) has no bands: the device's shape is not its own.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..devices import DeviceId, idle_activity_source
from ..ledger import (
    SM_BANDS,
    ActivityKind,
    ActivityLedger,
    ActivityPoint,
    interval_between,
    sm_band,
)
from .model import PodKey


def _kind_for(device: DeviceId) -> ActivityKind | None:
    source = idle_activity_source(device)
    if source == "none":
        return None
    return ActivityKind.UTILIZATION if source == "utilization" else ActivityKind.SM_ACTIVE


class PodActivity(Protocol):
    """Per-pod activity integrals on shared devices (the allocation's ContainerActivity)."""

    def until(self, uuid: str) -> float | None: ...

    def pod_seconds(self, uuid: str, pod: PodKey) -> float: ...


@dataclass
class PodUsage:
    """Counters of one pod on one device (all in seconds)."""

    device: DeviceId
    pod: PodKey
    classified_until: float
    allocated: float = 0.0
    idle: float = 0.0
    streak: float = 0.0
    released_at: float | None = None
    own: tuple[float, float] | None = None  # (at, seconds) of its own activity, shared devices
    # Seconds in each SM activity band (SM_BANDS); None until an SM interval was credited.
    # Replaced, not changed in place: readings hold it (UsageReading).
    bands: tuple[float, ...] | None = None


# One holder's counters as of an accounting round, what its series show: (device labels, pod,
# allocated, idle, streak, bands). idle is None where the device has no idle signal; streak None
# there too, or once released; bands (seconds per SM activity band) None until one is credited.
# Plain data, not a class: every holder's reading is new each round, and the garbage collector
# stops tracking a tuple of strings and numbers (bands is PodUsage's own tuple: a copy made here
# would keep each reading tracked), so readings never reach its old generation.
UsageReading = tuple[str, PodKey, float, float | None, float | None, tuple[float, ...] | None]


@dataclass
class _DeviceActivity:
    kind: ActivityKind
    point: ActivityPoint | None = None


class IdleAccountant:
    def __init__(
        self,
        ledger: ActivityLedger,
        threshold: float,
        *,
        retention: float = 300.0,
        pods: PodActivity | None = None,
    ) -> None:
        self._ledger = ledger
        self._pods = pods
        self._threshold = threshold
        # Released pods' counters stay published this long, so their last increase is scraped.
        self._retention = retention
        self._usage: dict[tuple[str, PodKey], PodUsage] = {}
        self._activity: dict[str, _DeviceActivity | None] = {}
        self._last: float | None = None

    def update(
        self,
        now: float,
        held: Mapping[DeviceId, set[PodKey]],
        replicated: Collection[str] = (),
    ) -> None:
        """Account the time since the previous update to the pods holding each device now;
        ``replicated``: uuids allocated through replica ids (shared even with one holder)."""
        resuming = self._last is None
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        current: set[tuple[str, PodKey]] = set()
        for device, pods in held.items():
            for pod in pods:
                key = (device.uuid, pod)
                current.add(key)
                self._hold(key, device, pod, now, dt, resuming)
            usages = [self._usage[(device.uuid, pod)] for pod in pods]
            shared = len(pods) > 1 or device.uuid in replicated
            self._classify(device, usages, shared)
        self._release(current, now)

    def pause(self) -> None:
        """Holders are unknown (kubelet down): the next update starts a fresh interval."""
        self._last = None

    def usages(self) -> Iterator[PodUsage]:
        return iter(self._usage.values())

    def readings(self) -> tuple[UsageReading, ...]:
        """Every holder's counters as they are now (frozen, for a published snapshot)."""
        readings: list[UsageReading] = []
        for u in self._usage.values():
            signal = self.has_idle_signal(u.device.uuid)
            idle = u.idle if signal else None
            streak = u.streak if signal and u.released_at is None else None
            readings.append((u.device.labels, u.pod, u.allocated, idle, streak, u.bands))
        return tuple(readings)

    def has_idle_signal(self, uuid: str) -> bool:
        return self._activity.get(uuid) is not None or self._own_signal(uuid)

    def _own_signal(self, uuid: str) -> bool:
        return self._pods is not None and self._pods.until(uuid) is not None

    def _hold(
        self,
        key: tuple[str, PodKey],
        device: DeviceId,
        pod: PodKey,
        now: float,
        dt: float,
        resuming: bool,
    ) -> None:
        usage = self._usage.get(key)
        if usage is None or usage.released_at is not None:
            # New (or back after a release): accounting starts now, not at the last update.
            if usage is None:
                usage = self._usage[key] = PodUsage(device, pod, classified_until=now)
            usage.released_at, usage.streak = None, 0.0
            usage.classified_until = max(usage.classified_until, now)
            return
        usage.device = device
        usage.allocated += dt
        if resuming:  # activity during an outage belongs to no known holder
            usage.classified_until = max(usage.classified_until, now)

    def _classify(self, device: DeviceId, usages: list[PodUsage], shared: bool) -> None:
        interval = self._next_interval(device)  # consumed either way, to stay current
        if shared and self._classify_own(device, usages):
            return
        if interval is None:
            return
        state = self._activity.get(device.uuid)
        banded = state is not None and state.kind is ActivityKind.SM_ACTIVE
        for usage in usages:
            self._count(usage, *interval, banded=banded)

    def _classify_own(self, device: DeviceId, usages: list[PodUsage]) -> bool:
        """Each pod by its own processes' activity; False when the device has none sampled."""
        until = self._pods.until(device.uuid) if self._pods is not None else None
        if self._pods is None or until is None:
            return False
        for usage in usages:
            seconds = self._pods.pod_seconds(device.uuid, usage.pod)
            previous, usage.own = usage.own, (until, seconds)
            if previous is None or until <= previous[0] or seconds < previous[1]:
                continue
            self._count(usage, previous[0], until, (seconds - previous[1]) / (until - previous[0]))
        return True

    def _count(
        self, usage: PodUsage, start: float, end: float, mean: float, *, banded: bool = False
    ) -> None:
        """Classify ``[start, end]`` (mean activity ``mean``) for one pod, once; ``banded``: the
        mean is SM activity, credited to the pod's band."""
        lo = max(start, usage.classified_until)
        if end <= lo:
            return
        usage.classified_until = end
        if banded:
            bands = list(usage.bands or (0.0,) * len(SM_BANDS))
            bands[sm_band(mean)] += end - lo
            usage.bands = tuple(bands)
        if mean < self._threshold:
            span = min(end - lo, usage.allocated - usage.idle)
            usage.idle += max(0.0, span)
            usage.streak += end - lo
        else:
            usage.streak = 0.0

    def _next_interval(self, device: DeviceId) -> tuple[float, float, float] | None:
        """The ledger interval since the last one consumed for ``device``, with its mean."""
        state = self._activity_state(device)
        if state is None:
            return None
        point = self._ledger.latest(device.uuid, state.kind)
        previous, state.point = state.point, point
        if point is None or previous is None:
            return None
        return interval_between(previous, point)

    def _activity_state(self, device: DeviceId) -> _DeviceActivity | None:
        """The device's signal: its preferred kind, else whatever the ledger has for it."""
        state = self._activity.get(device.uuid)
        preferred = _kind_for(device)
        kind = preferred
        for candidate in (preferred, ActivityKind.SM_ACTIVE, ActivityKind.UTILIZATION):
            if candidate is not None and self._ledger.latest(device.uuid, candidate) is not None:
                kind = candidate
                break
        if kind is None:
            self._activity[device.uuid] = None
            return None
        if state is None or state.kind is not kind:
            state = self._activity[device.uuid] = _DeviceActivity(kind)
        return state

    def _release(self, current: set[tuple[str, PodKey]], now: float) -> None:
        for key, usage in list(self._usage.items()):
            if key in current:
                continue
            if usage.released_at is None:
                usage.released_at, usage.streak = now, 0.0
            elif now - usage.released_at > self._retention:
                del self._usage[key]
