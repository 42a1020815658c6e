"""Clock event ("throttle") reasons: which are active now, and for how long they have been.

``gpu_clocks_event_seconds_total`` comes from NVML's own cumulative counters where the device has
them (SW power cap, sync boost, SW/HW thermal, HW power brake; nanoseconds per the NVML header)
and is integrated from the sampled flags for the other reasons (marked ``source="sampled"`` in the
docs, not in labels). Which reasons use a counter is decided on the first sample and kept, so a
series never switches source and jumps.
"""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

from ..devices import Device
from ..exposition import counter, gauge, label_string
from ..nvml import DeviceCalls
from .base import Cadence, Collector, CollectorContext, SampleWriter

ACTIVE = gauge(
    "gpu_clocks_event_active", "1 while the clock event reason holds clocks down, else 0."
)
SECONDS = counter(
    "gpu_clocks_event_seconds_total", "Time clocks were held down for this reason, in seconds."
)
NANOSECONDS = 1e-9


@dataclass(frozen=True)
class Reason:
    name: str
    mask: int
    counter_field: int | None  # NVML field id of the cumulative counter, where one exists
    labels: str


def _reason(name: str, mask: int, counter_field: int | None = None) -> Reason:
    return Reason(name, mask, counter_field, label_string({"reason": name}))


REASONS = (
    _reason("gpu_idle", 0x1),
    _reason("applications_clocks_setting", 0x2),
    _reason("sw_power_cap", 0x4, 74),
    _reason("hw_slowdown", 0x8),  # NVML has no counter for it
    _reason("sync_boost", 0x10, 76),
    _reason("sw_thermal_slowdown", 0x20, 269),
    _reason("hw_thermal_slowdown", 0x40, 270),
    _reason("hw_power_brake_slowdown", 0x80, 271),
    _reason("display_clock_setting", 0x100),
)
_COUNTER_FIELDS = tuple(r.counter_field for r in REASONS if r.counter_field is not None)


class ClockEventsCollector(Collector):
    name = "clock_events"
    help = "Clock event (throttle) reasons: active flags and time spent per reason."
    cadence = Cadence.FAST
    families = (ACTIVE, SECONDS)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._supported: tuple[Reason, ...] | None = None
        self._counted: frozenset[str] | None = None  # reasons whose time comes from NVML
        self._seconds: dict[str, float] = {}
        self._last_time: float | None = None

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        if self._supported is None:
            mask = calls.get(pynvml.nvmlDeviceGetSupportedClocksEventReasons, handle)
            if mask is None:
                return
            self._supported = tuple(r for r in REASONS if int(mask) & r.mask)
        current = calls.get(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
        if current is None:
            return
        now = self.context.clock()
        counters = calls.fields(handle, _COUNTER_FIELDS)
        if self._counted is None:
            self._counted = frozenset(
                r.name for r in self._supported if r.counter_field in counters
            )
        elapsed = 0.0 if self._last_time is None else now - self._last_time
        self._last_time = now
        for reason in self._supported:
            active = bool(int(current) & reason.mask)
            out.add(ACTIVE, 1.0 if active else 0.0, reason.labels)
            if reason.name in self._counted:
                value = counters.get(reason.counter_field or -1)
                if value is not None:
                    self._seconds[reason.name] = value * NANOSECONDS
            elif active:
                self._seconds[reason.name] = self._seconds.get(reason.name, 0.0) + elapsed
            out.add(SECONDS, self._seconds.setdefault(reason.name, 0.0), reason.labels)
