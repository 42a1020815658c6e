"""Per-process GPU activity, summed per container (the worker-thread read and the integration).

NVML keeps per-process utilisation samples in the driver and returns those newer than a
timestamp the caller passes (``nvmlDeviceGetProcessesUtilizationInfo``, or the older
``nvmlDeviceGetProcessUtilization``); NotFound means none is new. The reader keeps that
timestamp per device, so each sample is read exactly once: no sample is counted twice or dropped
as long as the reads come faster than the driver's buffer fills.

A sample's ``smUtil`` is the share of the sampling period during which the process had a kernel
resident (the per-process counterpart of ``nvmlDeviceGetUtilizationRates``), not GPM's SM
activity. The integrator turns samples into time integrals per owner (namespace, pod,
container): each sample counts for the time since the same process's previous sample, at most
one sampling period (estimated per device as the shortest gap between sample times), so a
process the driver stopped reporting for a while is not credited for the gap. The first read of a
device is a baseline: what the driver buffered before the exporter started is not counted.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pynvml

from ..devices import Device, DeviceId
from ..nvml import DeviceCalls, ErrorCounter, SupportRegistry

Owner = tuple[str, str, str]  # (namespace, pod, container); ("", "", "") for unknown processes
UNKNOWN: Owner = ("", "", "")
NEW_API = "nvmlDeviceGetProcessesUtilizationInfo"
# Until a device shows its sampling period, a sample counts for at most this long.
DEFAULT_PERIOD_US = 1_000_000
# Owners without a sample for this long are forgotten (their series withdrawn).
RETENTION_S = 300.0


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    timestamp_us: int  # wall clock, as the driver stamps it
    sm: float  # ratio 0..1
    memory: float  # ratio 0..1


class ProcessUtilizationReader:
    """Reads new per-process samples of one device per call (on a worker thread)."""

    def __init__(self, errors: ErrorCounter | None = None) -> None:
        self._support = SupportRegistry()
        self._errors = errors or ErrorCounter()
        self._last_seen: dict[str, int] = {}

    def __call__(self, device: Device) -> list[ProcessSample] | None:
        """Samples newer than the previous read; None when the device has no such signal."""
        calls = DeviceCalls(
            device.uuid,
            self._support,
            self._errors,
            collector="allocation",
            lost_uuid=device.gpu_uuid,
        )
        since = self._last_seen.get(device.uuid, 0)
        rows: Any = calls.get(pynvml.nvmlDeviceGetProcessesUtilizationInfo, device.handle, since)
        if rows is None and self._support.is_unsupported(device.uuid, NEW_API):
            rows = calls.get(pynvml.nvmlDeviceGetProcessUtilization, device.handle, since)
            if rows is None and self._support.is_unsupported(
                device.uuid, "nvmlDeviceGetProcessUtilization"
            ):
                return None
        if calls.failures:
            function, error = calls.failures[0]
            raise RuntimeError(f"{function}: {error}")
        samples = [
            ProcessSample(int(r.pid), int(r.timeStamp), r.smUtil / 100, r.memUtil / 100)
            for r in rows or ()
            if int(r.timeStamp) > since
        ]
        if samples:
            self._last_seen[device.uuid] = max(s.timestamp_us for s in samples)
        return samples

    def forget(self, uuid: str) -> None:
        self._last_seen.pop(uuid, None)


@dataclass
class OwnerActivity:
    """One owner's activity on one device: integrals (ratio-seconds) and the last batch's mean."""

    device: DeviceId
    owner: Owner
    sm_seconds: float = 0.0
    sm_ratio: float = 0.0
    memory_ratio: float = 0.0
    seen: float = 0.0  # monotonic time of its latest sample


@dataclass
class _DeviceState:
    last_us: int  # the newest sample time seen (0: none yet, still the baseline)
    period_us: int | None = None  # the shortest gap between sample times seen
    pid_last: dict[int, int] = field(default_factory=dict)
    until: float | None = None  # monotonic time the integrals are complete to


class ContainerActivity:
    """Integrates per-process samples into per-owner activity (on the event loop)."""

    def __init__(self, kept: Collection[Owner] = ()) -> None:
        """``kept``: owners never forgotten (their integrals are counters that must not
        restart: the per-device unattributed classes, at most a few per device)."""
        self._devices: dict[str, _DeviceState] = {}
        self._owners: dict[tuple[str, Owner], OwnerActivity] = {}
        self._kept = frozenset(kept)

    def add(
        self,
        device: DeviceId,
        samples: Iterable[ProcessSample],
        owner_of: Callable[[int], Owner | None],
        *,
        now: float,
        wall_now: float,
    ) -> None:
        """Account one read's samples; ``owner_of`` maps a pid to its container, if known."""
        batch = sorted(samples, key=lambda s: s.timestamp_us)
        state = self._devices.get(device.uuid)
        if state is None or state.last_us == 0:  # baseline: the buffer's history predates us
            self._devices[device.uuid] = state = _DeviceState(
                max((s.timestamp_us for s in batch), default=0)
            )
            state.pid_last = {s.pid: s.timestamp_us for s in batch}
            self._learn_period(state, batch)
            state.until = now - (wall_now - state.last_us / 1e6) if state.last_us else now
            return
        if not batch:
            return
        self._learn_period(state, batch)
        span = (batch[-1].timestamp_us - state.last_us) / 1e6
        gained: dict[Owner, list[float]] = {}
        for sample in batch:
            previous = state.pid_last.get(sample.pid, state.last_us)
            state.pid_last[sample.pid] = sample.timestamp_us
            dt = min(sample.timestamp_us - previous, state.period_us or DEFAULT_PERIOD_US) / 1e6
            totals = gained.setdefault(owner_of(sample.pid) or UNKNOWN, [0.0, 0.0])
            totals[0] += sample.sm * dt
            totals[1] += sample.memory * dt
        state.last_us = batch[-1].timestamp_us
        state.until = now - (wall_now - state.last_us / 1e6)
        self._publish(device, gained, span, now)

    def _publish(
        self, device: DeviceId, gained: Mapping[Owner, list[float]], span: float, now: float
    ) -> None:
        for (uuid, owner), activity in self._owners.items():
            if uuid == device.uuid and owner not in gained:
                activity.sm_ratio = activity.memory_ratio = 0.0
        for owner, (sm, memory) in gained.items():
            key = (device.uuid, owner)
            activity = self._owners.get(key) or OwnerActivity(device, owner)
            self._owners[key] = activity
            activity.device = device
            activity.sm_seconds += sm
            if span > 0:
                activity.sm_ratio, activity.memory_ratio = sm / span, memory / span
            activity.seen = now
        self._owners = {
            k: a
            for k, a in self._owners.items()
            if now - a.seen < RETENTION_S or a.owner in self._kept
        }

    @staticmethod
    def _learn_period(state: _DeviceState, batch: list[ProcessSample]) -> None:
        stamps = sorted({s.timestamp_us for s in batch})
        gaps = [b - a for a, b in itertools.pairwise(stamps) if b > a]
        if gaps:
            state.period_us = min(state.period_us or gaps[0], *gaps)

    def owners(self) -> Iterable[OwnerActivity]:
        return self._owners.values()

    def until(self, uuid: str) -> float | None:
        """Monotonic time up to which ``uuid``'s per-owner integrals are complete, if sampled."""
        state = self._devices.get(uuid)
        return state.until if state is not None else None

    def pod_seconds(self, uuid: str, pod: tuple[str, str]) -> float:
        """SM-active seconds of all the pod's containers on ``uuid`` since sampling began."""
        return sum(
            a.sm_seconds for (u, owner), a in self._owners.items() if u == uuid and owner[:2] == pod
        )

    def forget(self, uuid: str) -> None:
        self._devices.pop(uuid, None)
        self._owners = {k: a for k, a in self._owners.items() if k[0] != uuid}
