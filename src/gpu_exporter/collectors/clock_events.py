"""Clock event ("throttle") reasons: which are active now, and for how long they have been.

``gpu_clocks_event_seconds_total`` comes from NVML's own cumulative counters where the driver has
them (SW power cap, sync boost, SW/HW thermal, HW power brake; nanoseconds per the NVML header)
and is integrated from the sampled flags for the other reasons. The counters' field ids depend on
the driver build (``counter_fields``). Which reasons use a counter is decided on the first sample
and kept, so a series never switches source and jumps; a counter whose value type is not a 64-bit
integer is never used, and one that runs backwards or faster than wall time is refused (logged
once) and its reason goes on from the same total, integrated from the flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pynvml

from ..devices import Device
from ..exposition import counter, gauge, label_string
from ..logs import get_logger
from ..nvml import DeviceCalls
from ..nvml.calls import FieldKey
from .base import Cadence, Collector, CollectorContext, SampleWriter, option
from .counter_fields import counter_fields

ACTIVE = gauge(
    "gpu_clocks_event_active",
    "1 while the clock event reason holds clocks down, else 0.",
    served=False,  # the status page's; rate() of the _seconds_total twin says it to Prometheus
)
SECONDS = counter(
    "gpu_clocks_event_seconds_total",
    "Time clocks were held down for this reason, in seconds (the reasons that are not "
    "throttling with --collector.clock-events.detail).",
)
NANOSECONDS = 1e-9
# A nanosecond counter needs 64 bits (32 wrap in 4.3 s): unsigned long, unsigned long long,
# signed long long (nvmlValueType_t 2, 3, 4). A double or a 32-bit value is some other field.
COUNTER_VALUE_TYPES = frozenset({2, 3, 4})
# How far a counter may run ahead of wall time since its first reading: the driver's own update
# granularity and the call's latency (seconds), plus clock-rate differences (fraction).
AHEAD_SLACK_S = 1.0
AHEAD_RATE = 0.01
_log = get_logger("clock_events")


@dataclass(frozen=True)
class Reason:
    name: str
    mask: int
    labels: str
    # Throttling: clocks held below what the workload asks for. The others are clocks set on
    # purpose (idle, application clocks, sync boost, display): read by no alert, and their
    # time is served only with --collector.clock-events.detail (docs/migration.md).
    throttle: bool


def _reason(name: str, mask: int, *, throttle: bool = True) -> Reason:
    return Reason(name, mask, label_string({"reason": name}), throttle)


REASONS = (
    _reason("gpu_idle", 0x1, throttle=False),
    _reason("applications_clocks_setting", 0x2, throttle=False),
    _reason("sw_power_cap", 0x4),
    _reason("hw_slowdown", 0x8),  # NVML has no counter for it
    _reason("sync_boost", 0x10, throttle=False),
    _reason("sw_thermal_slowdown", 0x20),
    _reason("hw_thermal_slowdown", 0x40),
    _reason("hw_power_brake_slowdown", 0x80),
    _reason("display_clock_setting", 0x100, throttle=False),
)


@dataclass
class CounterCheck:
    """One reason's NVML counter and what it read so far, to tell a counter from anything else."""

    field: int
    first_ns: float | None = None
    first_time: float = 0.0
    last_ns: float = 0.0

    def problem(self, value_ns: float, now: float) -> str | None:
        """Why this reading cannot be the counter's, or None (and it is taken)."""
        if self.first_ns is None:
            self.first_ns, self.first_time, self.last_ns = value_ns, now, value_ns
            return None
        if value_ns < self.last_ns:
            return f"went backwards from {self.last_ns:.0f} to {value_ns:.0f} ns"
        advanced = (value_ns - self.first_ns) * NANOSECONDS
        wall = now - self.first_time
        if advanced > wall * (1 + AHEAD_RATE) + AHEAD_SLACK_S:
            return f"advanced {advanced:.3f} s in {wall:.3f} s of wall time"
        self.last_ns = value_ns
        return None


@dataclass(frozen=True)
class ClockEventsOptions:
    detail: bool = option(
        "--collector.clock-events.detail",
        False,
        help="also the clock-event reasons that are not throttling (gpu_idle, "
        "applications_clocks_setting, sync_boost, display_clock_setting)",
    )


class ClockEventsCollector(Collector):
    name = "clock_events"
    help = "Clock event (throttle) reasons: active flags and time spent per reason."
    cadence = Cadence.FAST
    families = (ACTIVE, SECONDS)
    options = (ClockEventsOptions,)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._supported: tuple[Reason, ...] | None = None
        self._fields: dict[str, int] = {}  # reason -> its counter's field id on this driver
        self._counters: dict[str, CounterCheck] | None = None  # reasons timed by NVML
        self._seconds: dict[str, float] = {}
        self._last_time: float | None = None
        self._batch = context.field_batch(device, self.cadence)
        self._detail = context.options.of(ClockEventsOptions).detail

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        if self._supported is None:
            mask = calls.get(pynvml.nvmlDeviceGetSupportedClocksEventReasons, handle)
            if mask is None:
                return
            self._supported = tuple(r for r in REASONS if int(mask) & r.mask)
            self._fields = self._driver_fields(calls)
            self._batch.want(sorted(set(self._fields.values())))
        current = calls.get(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
        if current is None:
            return
        now = self.context.clock()
        values, value_types = self._batch.read_with_types(calls, handle)
        if self._counters is None:
            self._counters = self._choose_counters(value_types)
        elapsed = 0.0 if self._last_time is None else now - self._last_time
        self._last_time = now
        for reason in self._supported:
            active = bool(int(current) & reason.mask)
            out.add(ACTIVE, 1.0 if active else 0.0, reason.labels)
            counted = self._read_counter(reason.name, values, now)
            if active and not counted:
                self._seconds[reason.name] = self._seconds.get(reason.name, 0.0) + elapsed
            seconds = self._seconds.setdefault(reason.name, 0.0)
            if reason.throttle or self._detail:
                out.add(SECONDS, seconds, reason.labels)

    def _driver_fields(self, calls: DeviceCalls) -> dict[str, int]:
        version = calls.get(pynvml.nvmlSystemGetDriverVersion)
        text = version.decode() if isinstance(version, bytes) else str(version or "")
        names = {r.name for r in self._supported or ()}
        return {name: fid for name, fid in counter_fields(text).items() if name in names}

    def _choose_counters(self, value_types: Mapping[FieldKey, int]) -> dict[str, CounterCheck]:
        """The reasons whose counter answered on the first sample, as a 64-bit integer."""
        chosen = {}
        for name, fid in self._fields.items():
            value_type = value_types.get(fid)
            if value_type is None:
                continue
            if value_type not in COUNTER_VALUE_TYPES:
                self._refuse(name, fid, f"its value type is {value_type}, not a counter's")
                continue
            chosen[name] = CounterCheck(fid)
        return chosen

    def _read_counter(self, name: str, values: Mapping[FieldKey, float], now: float) -> bool:
        """Take the reason's time from its counter; False when it has none (any more)."""
        check = (self._counters or {}).get(name)
        if check is None:
            return False
        value = values.get(check.field)
        if value is None:
            return True  # not read this round: the total stays where it was
        problem = check.problem(value, now)
        if problem is not None:
            self._refuse(name, check.field, problem)
            del (self._counters or {})[name]
            return False
        self._seconds[name] = value * NANOSECONDS
        return True

    def _refuse(self, reason: str, field: int, why: str) -> None:
        _log.warning(
            "clock event counter refused; the reason's time is integrated from sampled flags",
            uuid=self.device.uuid,
            reason=reason,
            field=field,
            why=why,
        )
