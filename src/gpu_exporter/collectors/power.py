"""Power draw (for the status page), the enforced limit, and energy as NVML's own counter (not
integrated here): ``rate(gpu_energy_joules_total)`` is the mean power draw."""

from __future__ import annotations

import pynvml

from ..devices import Device
from ..exposition import counter, gauge
from ..nvml import DeviceCalls
from .base import Cadence, Collector, CollectorContext, SampleWriter

# The instant draw is the status page's (served=False): rate() of the energy counter is the exact
# mean power over any window, so Prometheus reads that (docs/migration.md).
POWER = gauge("gpu_power_watts", "Power draw of the board, in watts.", served=False)
POWER_LIMIT = gauge("gpu_power_limit_watts", "Power limit the driver enforces, in watts.")
FIELD_TOTAL_ENERGY = 83  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ since the driver loaded
ENERGY = counter(
    "gpu_energy_joules_total", "Energy consumed since the driver was loaded, in joules."
)


class PowerCollector(Collector):
    name = "power"
    help = "Power draw, enforced power limit and total energy."
    cadence = Cadence.FAST
    families = (POWER, POWER_LIMIT, ENERGY)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._fields = context.field_batch(device, self.cadence)
        self._fields.want((FIELD_TOTAL_ENERGY,))

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        milliwatts = calls.get(pynvml.nvmlDeviceGetPowerUsage, handle)
        if milliwatts is not None:
            out.add(POWER, milliwatts / 1000.0)
        limit = calls.get(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        if limit is not None:
            out.add(POWER_LIMIT, limit / 1000.0)
        # The energy counter as a field: it rides in the device's one field read per round.
        millijoules = self._fields.read(calls, handle).get(FIELD_TOTAL_ENERGY)
        if millijoules is not None:
            out.add(ENERGY, millijoules / 1000.0)
