"""Current SM and memory clocks."""

from __future__ import annotations

import pynvml

from ..exposition import gauge, label_string
from ..nvml import DeviceCalls
from .base import Cadence, Collector, SampleWriter

CLOCK = gauge("gpu_clock_hertz", "Current clock frequency by domain (sm, memory), in hertz.")
_DOMAINS = (
    ("sm", pynvml.NVML_CLOCK_SM, label_string({"clock": "sm"})),
    ("memory", pynvml.NVML_CLOCK_MEM, label_string({"clock": "memory"})),
)


class ClocksCollector(Collector):
    name = "clocks"
    help = "Current SM and memory clock frequencies."
    cadence = Cadence.FAST
    families = (CLOCK,)

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        for domain, clock_type, labels in _DOMAINS:
            megahertz = calls.get(
                pynvml.nvmlDeviceGetClockInfo,
                self.device.handle,
                clock_type,
                signal=f"clock_{domain}",
            )
            if megahertz is not None:
                out.add(CLOCK, megahertz * 1_000_000, labels)
