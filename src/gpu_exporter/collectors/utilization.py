"""NVML's utilisation: the share of time *any* kernel was resident.

Kept because dashboards need it to show the gap: a single tiny kernel reads as 100% here while
SM activity says 2%. Not available on MIG-enabled GPUs (NVML says NotSupported; the series is
then omitted).
"""

from __future__ import annotations

import pynvml

from ..devices import Device
from ..exposition import counter, gauge
from ..ledger import ActivityKind
from ..nvml import DeviceCalls
from .base import Cadence, Collector, CollectorContext, Integral, SampleWriter, clamp_ratio

UTILIZATION = gauge(
    "gpu_utilization_ratio",
    "NVML utilisation: fraction of time one or more kernels ran (0..1); not SM activity.",
    served=False,  # the status page's; Prometheus reads rate() of the integral
)
UTILIZATION_SECONDS = counter(
    "gpu_utilization_seconds_total",
    "Seconds one or more kernels ran (NVML utilisation; not SM activity): rate() is the mean.",
)


class UtilizationCollector(Collector):
    name = "utilization"
    help = "NVML 'a kernel was resident' utilisation and its integral."
    cadence = Cadence.FAST
    families = (UTILIZATION, UTILIZATION_SECONDS)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._integral = Integral()

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        rates = calls.get(pynvml.nvmlDeviceGetUtilizationRates, self.device.handle)
        if rates is None:
            return
        ratio = clamp_ratio(float(rates.gpu))
        now = self.context.clock()
        total = self._integral.add(ratio, now)
        out.add(UTILIZATION, ratio)
        out.add(UTILIZATION_SECONDS, total)
        self.context.ledger.record(self.device.uuid, ActivityKind.UTILIZATION, now, total)
