"""Retired framebuffer pages (before Ampere; row remapping replaced them, NotSupported after)."""

from __future__ import annotations

import pynvml

from ..exposition import counter, gauge, label_string
from ..nvml import DeviceCalls
from .base import Cadence, Collector, SampleWriter

RETIRED = counter(
    "gpu_retired_pages_total",
    "Framebuffer pages retired, by cause (multiple_single_bit, double_bit).",
)
PENDING = gauge(
    "gpu_retired_pages_pending", "1 when a page retirement waits for the next driver reload."
)
_CAUSES = (
    (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        label_string({"cause": "multiple_single_bit"}),
        "retired_pages_sbe",
    ),
    (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        label_string({"cause": "double_bit"}),
        "retired_pages_dbe",
    ),
)


class RetiredPagesCollector(Collector):
    name = "retired_pages"
    help = "Retired pages by cause and the pending flag (pre-Ampere GPUs)."
    cadence = Cadence.SLOW
    families = (RETIRED, PENDING)

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        for cause, labels, signal in _CAUSES:
            pages = calls.get(pynvml.nvmlDeviceGetRetiredPages, handle, cause, signal=signal)
            if pages is not None:
                out.add(RETIRED, len(pages), labels)
        pending = calls.get(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        if pending is not None:
            out.add(PENDING, 1.0 if int(pending) else 0.0)
