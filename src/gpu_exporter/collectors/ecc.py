"""ECC error counters: corrected and uncorrected, since driver load (volatile), and over the
board's life (aggregate) with ``--collector.ecc.aggregate``: their rates are the same errors, so
the lifetime count is a second series of the same fact unless asked for (docs/migration.md)."""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

from ..devices import Device
from ..exposition import counter, label_string
from ..nvml import DeviceCalls
from .base import Cadence, Collector, CollectorContext, SampleWriter, option

# NVML_FI_DEV_ECC_CURRENT and the single/double-bit (corrected/uncorrected) totals as fields.
FIELD_ECC_CURRENT = 1
FIELDS = {
    ("corrected", "volatile"): 3,
    ("uncorrected", "volatile"): 4,
    ("corrected", "aggregate"): 5,
    ("uncorrected", "aggregate"): 6,
}
ECC_ERRORS = counter(
    "gpu_ecc_errors_total",
    "ECC errors by type (corrected, uncorrected) and counter (volatile since driver load; "
    "aggregate over the board's life with --collector.ecc.aggregate).",
)
# (NVML error type, counter type, labels, signal name, the same counter's field id).
_KINDS = tuple(
    (
        error_type,
        counter_type,
        label_string({"type": type_name, "counter": counter_name}),
        f"ecc_{type_name}_{counter_name}",
        FIELDS[(type_name, counter_name)],
    )
    for type_name, error_type in (
        ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
    )
    for counter_name, counter_type in (
        ("volatile", pynvml.NVML_VOLATILE_ECC),
        ("aggregate", pynvml.NVML_AGGREGATE_ECC),
    )
)


@dataclass(frozen=True)
class EccOptions:
    aggregate: bool = option(
        "--collector.ecc.aggregate",
        False,
        help="also the board-lifetime (aggregate) ECC counters beside the volatile ones",
    )


class EccCollector(Collector):
    name = "ecc"
    help = "ECC corrected/uncorrected error counters (volatile; aggregate on request)."
    cadence = Cadence.SLOW
    families = (ECC_ERRORS,)
    options = (EccOptions,)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        aggregate = context.options.of(EccOptions).aggregate
        self._kinds = tuple(k for k in _KINDS if aggregate or k[1] == pynvml.NVML_VOLATILE_ECC)
        # The mode and the four totals ride in the slow round's field read (no call of their
        # own); a driver without the fields gets the calls, as before.
        self._fields = context.field_batch(device, self.cadence)
        self._fields.want((FIELD_ECC_CURRENT, *(kind[4] for kind in self._kinds)))

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        values = self._fields.read(calls, self.device.handle)
        if FIELD_ECC_CURRENT in values:
            if int(values[FIELD_ECC_CURRENT]) != pynvml.NVML_FEATURE_ENABLED:
                return  # ECC off: the counters would read zero and mean nothing
            if all(field in values for *_, field in self._kinds):
                for *_, labels, _, field in self._kinds:
                    out.add(ECC_ERRORS, values[field], labels)
                return
        self._collect_by_calls(calls, out)

    def _collect_by_calls(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        mode = calls.get(pynvml.nvmlDeviceGetEccMode, handle)
        if mode is None or int(mode[0]) != pynvml.NVML_FEATURE_ENABLED:
            return
        for error_type, counter_type, labels, signal, _ in self._kinds:
            count = calls.get(
                pynvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter_type, signal=signal
            )
            if count is not None:
                out.add(ECC_ERRORS, count, labels)
