"""What the silicon actually does: SM, tensor-pipe and DRAM activity, with their time integrals.

The source sits behind a small boundary (:class:`ActivitySource`): GPM (Hopper and newer, per GPU
and per MIG instance), and a DCGM host engine's profiling fields for GPUs without GPM (A100, L40S,
L4, A10, T4, V100; :class:`DcgmActivitySource`). A device with no source reports
``activity_source="none"`` in ``gpu_info`` and no activity series, rather than a misleading
substitute.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pynvml

from ..dcgm.readings import DcgmReadings
from ..devices import Device, activity_source_name
from ..exposition import Family, counter, gauge, label_string
from ..ledger import SM_BANDS, ActivityKind, sm_band
from ..nvml import DeviceCalls
from .base import (
    Cadence,
    Collector,
    CollectorContext,
    Integral,
    SampleWriter,
    Scope,
    clamp_ratio,
    option,
)
from .engines import (
    EXTRA_GPM_METRICS,
    PIPE_SECONDS,
    EnginesOptions,
    PipeTotals,
    gpm_pipes,
    pipe_ratios,
)
from .gpm import GpmRequest

# The instant SM and tensor ratios are the status page's only (served=False): Prometheus reads
# the exact mean over any window as rate() of the _seconds_total integrals (docs/migration.md).
SM_ACTIVE = gauge(
    "gpu_sm_active_ratio",
    "Fraction of time at least one warp was resident on an SM, averaged over all SMs (0..1).",
    served=False,
)
SM_ACTIVE_SECONDS = counter(
    "gpu_sm_active_seconds_total",
    "Seconds at least one warp was resident on an SM, averaged over all SMs: rate() over any "
    "window is the exact mean SM activity.",
)
SM_ACTIVITY_BAND_SECONDS = counter(
    "gpu_sm_activity_band_seconds_total",
    "Seconds whose SM activity fell in each band (low: below 10%, mid: 10-50%, high: above 50%),"
    " judged per sample interval: rate() is the share of time in each band, the shape a mean"
    " hides (bursts with idle gaps split between high and low; steady small kernels sit in mid);"
    " with --collector.activity.detail.",
)
_BAND_LABELS = tuple(label_string({"band": band}) for band in SM_BANDS)
SM_OCCUPANCY = gauge(
    "gpu_sm_occupancy_ratio",
    "Resident warps relative to the SMs' maximum, averaged (0..1); with "
    "--collector.activity.detail.",
)
TENSOR_ACTIVE = gauge(
    "gpu_tensor_active_ratio",
    "Fraction of time any tensor pipe was active (0..1).",
    served=False,
)
TENSOR_ACTIVE_SECONDS = counter(
    "gpu_tensor_active_seconds_total",
    "Seconds any tensor pipe was active: rate() is the mean tensor activity (0..1).",
)
DRAM_ACTIVE_SECONDS = counter(
    "gpu_dram_active_seconds_total",
    "Time integral of the fraction of peak device-memory bandwidth in use: rate() is the mean "
    "DRAM activity (0..1).",
)


@dataclass(frozen=True)
class ActivityReading:
    """Mean activity ratios over ``[start, end]`` (monotonic seconds); None where unreadable."""

    start: float
    end: float
    sm_active: float | None
    sm_occupancy: float | None
    tensor_active: float | None
    dram_active: float | None
    # The other pipes ("pipe:fp64" -> ratio; engines.py).
    extra: Mapping[str, float] = field(default_factory=dict)
    # Seconds each ratio covers, where a source's ratios cover different spans (DCGM's fields
    # come from different passes, each with its own timestamps); None: all cover [start, end].
    spans: Mapping[str, float] | None = field(default=None, kw_only=True)

    def span(self, name: str) -> float:
        """The seconds ``name`` (``sm_active``, ...) is to be credited for."""
        if self.spans is None:
            return self.end - self.start
        return self.spans.get(name, 0.0)


# An ActivityReading's (sm_active, sm_occupancy, tensor_active, dram_active).
_Ratios = tuple[float | None, float | None, float | None, float | None]


class SmBands:
    """Time spent in each SM activity band, from the readings the integrals are built from."""

    def __init__(self) -> None:
        self._seconds = [0.0] * len(SM_BANDS)

    def credit(self, ratio: float, seconds: float) -> None:
        self._seconds[sm_band(ratio)] += seconds

    def emit(self, out: SampleWriter) -> None:
        for labels, seconds in zip(_BAND_LABELS, self._seconds, strict=True):
            out.add(SM_ACTIVITY_BAND_SECONDS, seconds, labels)


class ActivitySource(ABC):
    """Where a device's activity comes from. One instance per device, used on worker threads."""

    name: str

    @abstractmethod
    def read(self, calls: DeviceCalls) -> ActivityReading | None:
        """The activity since the previous read; None on the first read or when unavailable."""

    def close(self, calls: DeviceCalls) -> None:  # noqa: B027 - optional hook
        """Release what the source holds."""


_GPM_METRICS = (
    pynvml.NVML_GPM_METRIC_SM_UTIL,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
)
# GPM needs its two samples more than 100 ms apart (reference/nvml.md).
_GPM_MIN_SPACING = 0.1


class GpmSource(ActivitySource):
    """GPM metrics between two samples; the samples alternate so each read costs one sample."""

    name = "gpm"

    def __init__(self, device: Device, context: CollectorContext) -> None:
        self._device = device
        self._clock = context.clock
        self._buffers: list[Any] = []
        # The buffer last sampled into (None: no usable sample) and when, as two attributes: a
        # (buffer, time) tuple kept from round to round would be garbage-collector tracked.
        self._previous: Any | None = None
        self._previous_at = 0.0
        # Metric ids asked: pipes that answer NotSupported are not asked again. MIG instances
        # get no pipes: 10 series per instance would double a MIG node's series (56 instances).
        extra = () if device.id.is_mig else gpm_pipes(context.options.of(EnginesOptions).detail)
        self._request = GpmRequest((*_GPM_METRICS, *extra))

    def read(self, calls: DeviceCalls) -> ActivityReading | None:
        if not self._buffers:
            self._buffers = [calls.get(pynvml.nvmlGpmSampleAlloc) for _ in range(2)]
        if any(buffer is None for buffer in self._buffers):
            return None
        # Measured from after the previous sample to before this one: never more than the true
        # spacing, so a round that passes this check never gets GPM's too-close refusal.
        if self._previous is not None and self._clock() - self._previous_at <= _GPM_MIN_SPACING:
            return None
        sample = self._buffers[0] if self._previous is None else self._other(self._previous)
        if not self._take(calls, sample):
            self._previous = None
            return None
        now = self._clock()
        previous, previous_at = self._previous, self._previous_at
        self._previous, self._previous_at = sample, now
        if previous is None:
            return None
        return self._metrics(calls, (previous, previous_at), (sample, now))

    def close(self, calls: DeviceCalls) -> None:
        for buffer in self._buffers:
            if buffer is not None:
                calls.get(pynvml.nvmlGpmSampleFree, buffer)
        self._buffers = []

    def _other(self, sample: Any) -> Any:
        return self._buffers[1] if sample is self._buffers[0] else self._buffers[0]

    def _take(self, calls: DeviceCalls, sample: Any) -> bool:
        device = self._device
        if device.parent is not None:
            taken = calls.get(
                pynvml.nvmlGpmMigSampleGet,
                device.parent.handle,
                device.id.gpu_instance_id,
                sample,
            )
        else:
            taken = calls.get(pynvml.nvmlGpmSampleGet, device.handle, sample)
        return taken is not None

    def _metrics(
        self, calls: DeviceCalls, first: tuple[Any, float], second: tuple[Any, float]
    ) -> ActivityReading | None:
        answers = self._request.get(calls, first[0], second[0])
        if answers is None:
            return None
        answered: dict[int, float] = {}
        lacking: set[int] = set()
        for metric_id, code, value in answers:
            if code == pynvml.NVML_SUCCESS:
                answered[metric_id] = value
            elif code == pynvml.NVML_ERROR_NOT_SUPPORTED and metric_id in EXTRA_GPM_METRICS:
                lacking.add(metric_id)
        if lacking:
            self._request.set_ids([m for m in self._request.ids if m not in lacking])

        def ratio(metric_id: int) -> float | None:
            return clamp_ratio(answered[metric_id]) if metric_id in answered else None

        sm, occupancy, tensor, dram = (ratio(m) for m in _GPM_METRICS)
        extra = pipe_ratios(answered)
        return ActivityReading(first[1], second[1], sm, occupancy, tensor, dram, extra)


class DcgmActivitySource(ActivitySource):
    """DCGM's profiling fields for one device, from the DCGM service's last read.

    The DCGM service reads every served device's latest records once per poll; this source turns
    one device's records into an :class:`ActivityReading` without any call of its own. Each
    record is a ratio the engine computed over roughly one update interval ending at its
    timestamp [reference/dcgm.md section 3], so the integral credits each new record's value for
    the time since the field's previous record, on DCGM's clock. That is approximate, unlike
    GPM's exact means: multiplexed passes sample only part of the time, the stamps are the
    engine's wall clock, and a record the poll missed is covered by the next one's value. Gaps
    over ``DCGM_MAX_GAP_S`` (an outage) are not credited at all.
    """

    name = "dcgm"

    def __init__(self, uuid: str, readings: DcgmReadings, clock: Callable[[], float]) -> None:
        self._uuid = uuid
        self._readings = readings
        self._clock = clock
        self._generation: int | None = None
        self._previous: dict[int, int] = {}  # field -> ts (us) of the last record credited
        self._offset: float | None = None  # exporter monotonic time minus DCGM time, seconds

    def read(self, calls: DeviceCalls) -> ActivityReading | None:
        snapshot = self._readings.latest(self._uuid)
        if snapshot is None:  # the engine is away: withdraw the series rather than repeat them
            return self._nothing()
        if snapshot.generation != self._generation:  # a new session: start the stamps afresh
            self._generation, self._previous = snapshot.generation, {}
        values: dict[str, float | None] = {}
        spans: dict[str, float] = {}
        newest = 0
        for name, field_id in DCGM_FIELDS.items():
            sample = snapshot.fields.get(field_id)
            if sample is None or sample.value is None or sample.ts_us <= 0:
                values[name] = None  # blank, or a per-record error: no value
                continue
            values[name] = min(max(sample.value, 0.0), 1.0)
            spans[name] = self._span(field_id, sample.ts_us)
            newest = max(newest, sample.ts_us)
        if not spans:  # every field blank (counters taken by another profiler, paused)
            return self._nothing()
        stamp = newest / 1e6
        if self._offset is None:
            self._offset = self._clock() - stamp
        end = stamp + self._offset
        start = end - spans.get("sm_active", 0.0)
        return ActivityReading(
            start,
            end,
            values["sm_active"],
            values["sm_occupancy"],
            values["tensor_active"],
            values["dram_active"],
            spans=spans,
        )

    def _nothing(self) -> ActivityReading:
        now = self._clock()
        return ActivityReading(now, now, None, None, None, None)

    def _span(self, field_id: int, ts_us: int) -> float:
        """Seconds to credit this record for: since the field's previous record."""
        previous = self._previous.get(field_id)
        self._previous[field_id] = ts_us
        if previous is None or ts_us <= previous:
            return 0.0  # the first record, the same one again, or a clock that went back
        gap = (ts_us - previous) / 1e6
        return gap if gap <= DCGM_MAX_GAP_S else 0.0


def make_activity_source(device: Device, context: CollectorContext) -> ActivitySource | None:
    source = activity_source_name(device.id)
    if source == "gpm":
        return GpmSource(device, context)
    readings = context.dcgm.readings
    if source == "dcgm" and readings is not None:
        return DcgmActivitySource(device.uuid, readings, context.clock)
    return None


# Reading attribute -> DCGM field [dcgm_fields.h; reference/dcgm.md section 4].
DCGM_FIELDS = {
    "sm_active": 1002,  # DCGM_FI_PROF_SM_ACTIVE
    "sm_occupancy": 1003,  # DCGM_FI_PROF_SM_OCCUPANCY
    "tensor_active": 1004,  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    "dram_active": 1005,  # DCGM_FI_PROF_DRAM_ACTIVE
}
DCGM_MAX_GAP_S = 10.0  # longer: an outage or a profiler holding the counters, not credited


@dataclass(frozen=True)
class ActivityOptions:
    detail: bool = option(
        "--collector.activity.detail",
        False,
        help="also each GPU's SM activity bands and SM occupancy",
    )


class ActivityCollector(Collector):
    name = "activity"
    help = (
        "SM, SM occupancy, tensor and DRAM activity (GPM, or DCGM) with _seconds_total integrals."
    )
    cadence = Cadence.FAST
    scope = Scope.ANY
    families = (
        SM_ACTIVE,
        SM_ACTIVE_SECONDS,
        SM_ACTIVITY_BAND_SECONDS,
        SM_OCCUPANCY,
        TENSOR_ACTIVE,
        TENSOR_ACTIVE_SECONDS,
        DRAM_ACTIVE_SECONDS,
        PIPE_SECONDS,
    )
    options = (EnginesOptions, ActivityOptions)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._source = make_activity_source(device, context)
        self._sm = Integral()
        self._bands = SmBands()
        self._tensor = Integral()
        self._dram = Integral()
        self._pipes = PipeTotals()
        # The last reading's ratios as a plain tuple of floats, which the garbage collector
        # untracks: the reading itself, kept from round to round, would be promoted by every
        # collection.
        self._last: _Ratios | None = None
        # The GPU's bands and its occupancy are read by no alert, rule or dashboard (a holder's
        # bands are allocation's, from the same readings): served with --collector.activity.detail
        self._detail = context.options.of(ActivityOptions).detail

    @classmethod
    def applies_to(cls, device: Device) -> bool:
        return activity_source_name(device.id) != "none"

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        if self._source is None:
            return
        reading = self._source.read(calls)
        if reading is not None:
            self._integrate(reading)
            self._last = (
                reading.sm_active,
                reading.sm_occupancy,
                reading.tensor_active,
                reading.dram_active,
            )
            if reading.sm_active is not None:
                self.context.ledger.record(
                    self.device.uuid, ActivityKind.SM_ACTIVE, reading.end, self._sm.total
                )
        if self._last is None:
            return
        sm_active, sm_occupancy, tensor_active, dram_active = self._last
        self._emit(out, SM_ACTIVE, SM_ACTIVE_SECONDS, sm_active, self._sm)
        if sm_active is not None and self._detail:
            self._bands.emit(out)
        self._emit(out, TENSOR_ACTIVE, TENSOR_ACTIVE_SECONDS, tensor_active, self._tensor)
        self._emit(out, None, DRAM_ACTIVE_SECONDS, dram_active, self._dram)
        if sm_occupancy is not None and self._detail:
            out.add(SM_OCCUPANCY, sm_occupancy)
        self._pipes.emit(out)

    def close(self, calls: DeviceCalls) -> None:
        if self._source is not None:
            self._source.close(calls)

    def _integrate(self, reading: ActivityReading) -> None:
        for name, integral, ratio in (
            ("sm_active", self._sm, reading.sm_active),
            ("tensor_active", self._tensor, reading.tensor_active),
            ("dram_active", self._dram, reading.dram_active),
        ):
            if ratio is not None:
                integral.total += ratio * reading.span(name)
        if reading.sm_active is not None:
            self._bands.credit(reading.sm_active, reading.span("sm_active"))
        self._pipes.credit(reading.extra, reading.end - reading.start)

    @staticmethod
    def _emit(
        out: SampleWriter,
        ratio_family: Family | None,
        seconds_family: Family,
        ratio: float | None,
        total: Integral,
    ) -> None:
        if ratio is None:
            return
        if ratio_family is not None:
            out.add(ratio_family, ratio)
        out.add(seconds_family, total.total)
