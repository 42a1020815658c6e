"""ECC error counters: corrected and uncorrected, since driver load and over the board's life."""

from __future__ import annotations

import pynvml

from ..exposition import counter, label_string
from ..nvml import DeviceCalls
from .base import Cadence, Collector, SampleWriter

ECC_ERRORS = counter(
    "gpu_ecc_errors_total",
    "ECC errors by type (corrected, uncorrected) and counter (volatile since driver load, "
    "aggregate over the board's life).",
)
_KINDS = tuple(
    (
        error_type,
        counter_type,
        label_string({"type": type_name, "counter": counter_name}),
        f"ecc_{type_name}_{counter_name}",
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


class EccCollector(Collector):
    name = "ecc"
    help = "ECC corrected/uncorrected error counters (volatile and aggregate)."
    cadence = Cadence.SLOW
    families = (ECC_ERRORS,)

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        mode = calls.get(pynvml.nvmlDeviceGetEccMode, handle)
        if mode is None or int(mode[0]) != pynvml.NVML_FEATURE_ENABLED:
            return  # ECC off: the counters would read zero and mean nothing
        for error_type, counter_type, labels, signal in _KINDS:
            count = calls.get(
                pynvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter_type, signal=signal
            )
            if count is not None:
                out.add(ECC_ERRORS, count, labels)
