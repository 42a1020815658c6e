"""Every GPM pipe and the media engines: the graphics pipe and the encoder and decoder engines
(the FP64, FP32, FP16 and integer pipes and the JPEG and optical-flow engines with
``--collector.pipes.detail``), each a ``_seconds_total`` integral of its ratio (rate()
is the mean ratio over any window: no instant gauge beside it, docs/migration.md).

The pipes come from the same ``nvmlGpmMetricsGet`` call as SM activity (Hopper and newer; no
extra NVML call; exact means between the two samples). The engines come from
``nvmlDevice{Encoder,Decoder,Jpg,Ofa}Utilization`` on the slow cadence, for every GPU: NVML's
trailing average at that moment, credited for the slow interval, so their integral is
approximate. GPM has per-instance engine metrics too (``NVML_GPM_METRIC_NVDEC_0_UTIL``...), but
asking for the 22 instances every fast round cost more CPU than the engines are worth on compute
nodes (docs/performance.md). Tensor keeps its own families (``gpu_tensor_active_*``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pynvml

from ..devices import Device
from ..exposition import counter, label_string
from ..nvml import DeviceCalls
from .base import (
    Cadence,
    Collector,
    CollectorContext,
    Integral,
    SampleWriter,
    clamp_ratio,
    option,
)

PIPE_SECONDS = counter(
    "gpu_pipe_active_seconds_total",
    "Seconds the SMs' pipe was active (graphics; fp64, fp32, fp16, integer with "
    "--collector.pipes.detail; GPM): rate() is the mean fraction of time (0..1).",
)
ENGINE_SECONDS = counter(
    "gpu_engine_utilization_seconds_total",
    "Time integral of the media engines' utilisation (encoder, decoder, jpeg, ofa; mean over "
    "instances): rate() is the mean utilisation (0..1).",
)
FAMILIES = (PIPE_SECONDS, ENGINE_SECONDS)

# GPM metric ids (pynvml NVML_GPM_METRIC_*): one per pipe; each engine's instances.
PIPES = {
    "fp64": pynvml.NVML_GPM_METRIC_FP64_UTIL,
    "fp32": pynvml.NVML_GPM_METRIC_FP32_UTIL,
    "fp16": pynvml.NVML_GPM_METRIC_FP16_UTIL,
    "integer": pynvml.NVML_GPM_METRIC_INTEGER_UTIL,
    "graphics": pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
}
EXTRA_GPM_METRICS = tuple(PIPES.values())
# Read by no alert, rule or dashboard of the kit, and not among dcgm-exporter's defaults (its
# FP64/FP32/FP16 fields are commented out there; the compatibility series of those read them
# where served): asked for and served only with --collector.pipes.detail (docs/migration.md).
DETAIL_PIPES = frozenset(
    {
        pynvml.NVML_GPM_METRIC_FP64_UTIL,
        pynvml.NVML_GPM_METRIC_FP32_UTIL,
        pynvml.NVML_GPM_METRIC_FP16_UTIL,
        pynvml.NVML_GPM_METRIC_INTEGER_UTIL,
    }
)
DETAIL_ENGINES = frozenset({"jpeg", "ofa"})


@dataclass(frozen=True)
class EnginesOptions:
    """Read by the engines collector and by activity, which asks GPM for the pipes."""

    detail: bool = option(
        "--collector.pipes.detail",
        False,
        help="also the FP64, FP32, FP16 and integer pipes (GPM) and the JPEG and optical-flow "
        "engines",
    )


def gpm_pipes(detail: bool) -> tuple[int, ...]:
    """The pipe metric ids to ask GPM for."""
    return tuple(m for m in EXTRA_GPM_METRICS if detail or m not in DETAIL_PIPES)


def pipe_ratios(values: Mapping[int, float]) -> dict[str, float]:
    """GPM's answers (metric id -> percent) as ``pipe:<name>`` ratios."""
    return {f"pipe:{pipe}": clamp_ratio(values[m]) for pipe, m in PIPES.items() if m in values}


class PipeTotals:
    """The integrals of one device's pipe and engine ratios, and their samples."""

    def __init__(self) -> None:
        self._totals: dict[str, Integral] = {}
        self._last: dict[str, float] = {}
        self._labels: dict[str, str] = {}

    def credit(self, ratios: Mapping[str, float], seconds: float) -> None:
        """Credit each ratio for ``seconds`` (the exact span GPM measured, or an interval)."""
        for key, ratio in ratios.items():
            self._totals.setdefault(key, Integral()).total += ratio * seconds
        self._last = dict(ratios)

    def emit(self, out: SampleWriter) -> None:
        for key in self._last:
            kind, name = key.split(":", 1)
            labels = self._labels.get(key)
            if labels is None:
                labels = self._labels[key] = label_string({kind: name})
            family = PIPE_SECONDS if kind == "pipe" else ENGINE_SECONDS
            out.add(family, self._totals[key].total, labels)


_ENGINE_CALLS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("encoder", pynvml.nvmlDeviceGetEncoderUtilization),
    ("decoder", pynvml.nvmlDeviceGetDecoderUtilization),
    ("jpeg", pynvml.nvmlDeviceGetJpgUtilization),
    ("ofa", pynvml.nvmlDeviceGetOfaUtilization),
)


class EnginesCollector(Collector):
    """Media engines from NVML's utilisation calls (slow cadence), on every whole GPU."""

    name = "engines"
    help = "Encoder, decoder, JPEG and OFA utilisation (slow cadence)."
    cadence = Cadence.SLOW
    families = (ENGINE_SECONDS,)
    options = (EnginesOptions,)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._totals = PipeTotals()
        self._last_time: float | None = None
        detail = context.options.of(EnginesOptions).detail
        self._calls = tuple(c for c in _ENGINE_CALLS if detail or c[0] not in DETAIL_ENGINES)

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        ratios = {}
        for engine, function in self._calls:
            answer = calls.get(function, self.device.handle)
            if answer is not None:
                ratios[f"engine:{engine}"] = clamp_ratio(float(answer[0]))
        now = self.context.clock()
        elapsed = 0.0 if self._last_time is None else now - self._last_time
        self._last_time = now
        self._totals.credit(ratios, elapsed)
        self._totals.emit(out)
