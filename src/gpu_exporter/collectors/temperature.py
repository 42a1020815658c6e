"""GPU die and HBM temperatures."""

from __future__ import annotations

import pynvml

from ..devices import Device
from ..exposition import gauge, label_string
from ..nvml import DeviceCalls
from .base import Cadence, Collector, CollectorContext, SampleWriter

TEMPERATURE = gauge("gpu_temperature_celsius", "Temperature by sensor (gpu die, memory), in °C.")
_GPU = label_string({"sensor": "gpu"})
_MEMORY = label_string({"sensor": "memory"})
FIELD_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP


class TemperatureCollector(Collector):
    name = "temperature"
    help = "GPU die and memory temperature."
    cadence = Cadence.FAST
    families = (TEMPERATURE,)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._fields = context.field_batch(device, self.cadence)
        self._fields.want((FIELD_MEMORY_TEMP,))

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        die = calls.get(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
        if die is not None:
            out.add(TEMPERATURE, die, _GPU)
        memory = self._fields.read(calls, handle).get(FIELD_MEMORY_TEMP)
        if memory is not None:
            out.add(TEMPERATURE, memory, _MEMORY)
