"""The temperatures at which the GPU slows down and shuts down (and its operating maxima).

Next to ``gpu_temperature_celsius`` they say how close a hot GPU is to throttling. Fixed by the
board's firmware, so they are read on the first slow round only and then served from memory.
"""

from __future__ import annotations

import pynvml

from ..devices import Device
from ..exposition import gauge, label_string
from ..nvml import DeviceCalls
from .base import Cadence, Collector, CollectorContext, SampleWriter

THRESHOLD = gauge(
    "gpu_temperature_threshold_celsius",
    "Temperature thresholds of the GPU (slowdown, shutdown, gpu_max, memory_max), in °C.",
)
THRESHOLDS = (
    ("slowdown", pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
    ("shutdown", pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
    ("gpu_max", pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
    ("memory_max", pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
)


class ThresholdsCollector(Collector):
    name = "thresholds"
    help = "Temperature thresholds: slowdown, shutdown, GPU and memory maximum (read once)."
    cadence = Cadence.SLOW
    # Constants of the board (4 series per GPU) that no rule or dashboard of the kit reads:
    # --collector.thresholds serves them (docs/migration.md).
    enabled_by_default = False
    families = (THRESHOLD,)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._values: dict[str, float] | None = None

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        if self._values is None:
            values = {}
            for name, threshold in THRESHOLDS:
                value = calls.get(
                    pynvml.nvmlDeviceGetTemperatureThreshold,
                    self.device.handle,
                    threshold,
                    signal=f"temperature_threshold.{name}",
                )
                if value is not None:
                    values[name] = float(value)
            if calls.failures:
                return  # try again next round rather than remember a partial answer
            self._values = values
        for name, value in self._values.items():
            out.add(THRESHOLD, value, label_string({"threshold": name}))
