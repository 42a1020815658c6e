"""Framebuffer memory of whole GPUs and MIG instances (NVML memory info v2, v1 as fallback).

Free memory is not a series of its own: NVML's free is total - used - reserved (v2; v1 counts
reserved as used), which a query derives (docs/migration.md).
"""

from __future__ import annotations

from typing import Any

import pynvml

from ..exposition import gauge
from ..nvml import DeviceCalls
from .base import Cadence, Collector, SampleWriter, Scope

TOTAL = gauge("gpu_memory_total_bytes", "Framebuffer memory of the device, in bytes.")
USED = gauge("gpu_memory_used_bytes", "Framebuffer memory in use (allocations), in bytes.")
RESERVED = gauge(
    "gpu_memory_reserved_bytes", "Framebuffer memory reserved by the driver and firmware, in bytes."
)

# Real drivers have answered FunctionNotFound (13), not ArgumentVersionMismatch, when they do not
# take the nvmlMemory_v2 struct version the binding sends: the log line says so.
_V2_EXPLAINED = (
    f"nvmlDeviceGetMemoryInfo_v2 with struct version {pynvml.nvmlMemory_v2:#010x}: a driver "
    "answers FunctionNotFound also for a struct version it does not take (nvidia-ml-py newer "
    "or older than the driver); memory is read with v1 instead, which counts reserved memory "
    "as used, and gpu_memory_reserved_bytes is omitted until the driver or binding match"
)


class MemoryCollector(Collector):
    name = "memory"
    help = "Framebuffer total, used and reserved bytes."
    cadence = Cadence.FAST
    scope = Scope.ANY
    families = (TOTAL, USED, RESERVED)

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        info: Any = calls.get(
            pynvml.nvmlDeviceGetMemoryInfo,
            handle,
            pynvml.nvmlMemory_v2,
            signal="memory_v2",
            explain=_V2_EXPLAINED,
        )
        if info is None:  # drivers and MIG handles without v2 still answer v1
            info = calls.get(pynvml.nvmlDeviceGetMemoryInfo, handle, signal="memory_v1")
        if info is None:
            return
        out.add(TOTAL, info.total)
        out.add(USED, info.used)
        reserved = getattr(info, "reserved", None)
        if reserved is not None:
            out.add(RESERVED, reserved)
