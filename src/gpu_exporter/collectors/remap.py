"""Row remapping (Ampere and newer): remapped rows, pending and failed remaps, spare-row banks.

Pending means a remap waits for the next GPU reset (reset when convenient); failure is RMA
territory. NVML answers NotSupported on MIG-enabled GPUs with active instances: the series are
then omitted rather than reported as zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

from ..devices import Device
from ..exposition import counter, gauge, label_string
from ..nvml import DeviceCalls
from .base import Cadence, Collector, CollectorContext, SampleWriter, option

REMAPPED_ROWS = counter(
    "gpu_remapped_rows_total", "Memory rows remapped, by the error that caused the remap."
)
PENDING = gauge("gpu_row_remap_pending", "1 when a row remap waits for the next GPU reset.")
FAILED = gauge("gpu_row_remap_failed", "1 when a row remap failed (the GPU needs replacement).")
BANKS = gauge(
    "gpu_row_remap_banks",
    "Memory banks by how many spare rows remain (low, none; with --collector.remap.banks also "
    "max, high, partial).",
)
# The banks a failing memory shows up in; the rest of the histogram is detail on request.
_FEW_SPARES = ("low", "none")
_CORRECTABLE = label_string({"cause": "correctable"})
_UNCORRECTABLE = label_string({"cause": "uncorrectable"})
_AVAILABILITY = tuple(
    (name, label_string({"availability": name}))
    for name in ("max", "high", "partial", "low", "none")
)


@dataclass(frozen=True)
class RemapOptions:
    banks: bool = option(
        "--collector.remap.banks",
        False,
        help="the whole spare-row bank histogram (max, high, partial, low, none), not only the "
        "low and none banks",
    )


class RemapCollector(Collector):
    name = "remap"
    help = "Row remapping counts, pending/failed flags and the banks with few spare rows."
    cadence = Cadence.SLOW
    families = (REMAPPED_ROWS, PENDING, FAILED, BANKS)
    options = (RemapOptions,)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        every = context.options.of(RemapOptions).banks
        self._banks = tuple(a for a in _AVAILABILITY if every or a[0] in _FEW_SPARES)

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        rows = calls.get(pynvml.nvmlDeviceGetRemappedRows, handle)
        if rows is not None:
            correctable, uncorrectable, pending, failed = rows
            out.add(REMAPPED_ROWS, correctable, _CORRECTABLE)
            out.add(REMAPPED_ROWS, uncorrectable, _UNCORRECTABLE)
            out.add(PENDING, 1.0 if pending else 0.0)
            out.add(FAILED, 1.0 if failed else 0.0)
            if failed:
                self.context.on_remap_failure(self.device.id)
        histogram = calls.get(pynvml.nvmlDeviceGetRowRemapperHistogram, handle)
        if histogram is not None:
            for name, labels in self._banks:
                out.add(BANKS, getattr(histogram, name), labels)
