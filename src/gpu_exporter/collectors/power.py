"""Power draw, the enforced limit, and energy as NVML's own counter (not integrated here)."""

from __future__ import annotations

import pynvml

from ..exposition import counter, gauge
from ..nvml import DeviceCalls
from .base import Cadence, Collector, SampleWriter

POWER = gauge("gpu_power_watts", "Power draw of the board, in watts.")
POWER_LIMIT = gauge("gpu_power_limit_watts", "Power limit the driver enforces, in watts.")
ENERGY = counter(
    "gpu_energy_joules_total", "Energy consumed since the driver was loaded, in joules."
)


class PowerCollector(Collector):
    name = "power"
    help = "Power draw, enforced power limit and total energy."
    cadence = Cadence.FAST
    families = (POWER, POWER_LIMIT, ENERGY)

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        milliwatts = calls.get(pynvml.nvmlDeviceGetPowerUsage, handle)
        if milliwatts is not None:
            out.add(POWER, milliwatts / 1000.0)
        limit = calls.get(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        if limit is not None:
            out.add(POWER_LIMIT, limit / 1000.0)
        millijoules = calls.get(pynvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        if millijoules is not None:
            out.add(ENERGY, millijoules / 1000.0)
