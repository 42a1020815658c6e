"""PCIe: the link the GPU trained to (slow) and its replays, errors and traffic (fast, fields).

Generation drops at idle by design (power saving), so a link below its maximum generation is a
fault only while the GPU is busy; width does not drop at idle, and a width below the maximum is a
link that trained down (a bad riser, slot or cable). ``max`` is what the GPU *and* its slot can
do (``nvmlDeviceGetMaxPcieLinkGeneration``/``Width``), so a Gen5 GPU in a Gen4 slot is not degraded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pynvml

from ..devices import Device
from ..exposition import Family, counter, gauge, label_string
from ..nvml import DeviceCalls
from ..nvml.calls import FieldKey
from .base import Cadence, Collector, CollectorContext, SampleWriter, option
from .counters import fields_of
from .fields import FieldBatch

GENERATION = gauge("gpu_pcie_link_generation", "PCIe generation the link runs at now.")
MAX_GENERATION = gauge(
    "gpu_pcie_link_max_generation", "Highest PCIe generation the GPU and its slot support."
)
WIDTH = gauge("gpu_pcie_link_width_lanes", "PCIe lanes the link runs with now.")
MAX_WIDTH = gauge(
    "gpu_pcie_link_max_width_lanes", "Widest PCIe link the GPU and its slot support, in lanes."
)
REPLAYS = counter(
    "gpu_pcie_replays_total", "PCIe replays (retransmitted transaction-layer packets)."
)
ERRORS = counter(
    "gpu_pcie_errors_total", "PCIe errors the GPU counted, by type (those the device reports)."
)
TRANSMIT = counter("gpu_pcie_transmit_bytes_total", "Bytes the GPU transmitted over PCIe.")
RECEIVE = counter("gpu_pcie_receive_bytes_total", "Bytes the GPU received over PCIe.")
TX_FIELD, RX_FIELD = 197, 198  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES / RX_BYTES


class PcieCounters:
    """Replays and traffic of one GPU, from its fast field batch (part of the interconnect job)."""

    families = (REPLAYS, TRANSMIT, RECEIVE)

    def __init__(self, batch: FieldBatch) -> None:
        self._replays = fields_of("pcie_replays")
        batch.want(f.field_id for f in self._replays)
        batch.want((TX_FIELD, RX_FIELD))

    def emit(self, out: SampleWriter, values: Mapping[FieldKey, float]) -> None:
        for row in self._replays:
            if (value := values.get(row.field_id)) is not None:
                out.add(REPLAYS, value)
        for family, field_id in ((TRANSMIT, TX_FIELD), (RECEIVE, RX_FIELD)):
            if (value := values.get(field_id)) is not None:
                out.add(family, value)


_LINK_CALLS: tuple[tuple[Family, Callable[[Any], int]], ...] = (
    (GENERATION, pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
    (MAX_GENERATION, pynvml.nvmlDeviceGetMaxPcieLinkGeneration),
    (WIDTH, pynvml.nvmlDeviceGetCurrPcieLinkWidth),
    (MAX_WIDTH, pynvml.nvmlDeviceGetMaxPcieLinkWidth),
)


@dataclass(frozen=True)
class PcieLinkOptions:
    errors: bool = option(
        "--collector.pcie.errors",
        False,
        help="also the PCIe AER error and link-recovery counters (gpu_pcie_errors_total)",
    )


class PcieLinkCollector(Collector):
    name = "pcie_link"
    help = (
        "PCIe link generation and width, and the PCIe error counters with "
        "--collector.pcie.errors (slow cadence)."
    )
    cadence = Cadence.SLOW
    families = (*(family for family, _ in _LINK_CALLS), ERRORS)
    options = (PcieLinkOptions,)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        # Diagnostic counters, read by no alert (the kit's link alerts read replays, width and
        # generation): asked for and served only with --collector.pcie.errors, on the slow
        # round's field read (replays stay fast).
        wanted = fields_of("pcie_errors") if context.options.of(PcieLinkOptions).errors else ()
        self._errors = [(f.field_id, label_string({"type": f.type})) for f in wanted]
        self._fields = context.field_batch(device, self.cadence)
        self._fields.want(field_id for field_id, _ in self._errors)

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        for family, function in _LINK_CALLS:
            value = calls.get(function, self.device.handle)
            if value is not None:
                out.add(family, value)
        values = self._fields.read(calls, self.device.handle)
        for field_id, labels in self._errors:
            if (count := values.get(field_id)) is not None:
                out.add(ERRORS, count, labels)
