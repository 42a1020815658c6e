"""Fake NVML: device state third-party tools read (nvitop, nvidia-smi-like dashboards).

PCIe throughput, BAR1, compute capability, confidential-computing memory split, and
handle lookups by PCI bus id or serial. Single-constant answers (persistence mode, P-state, ...)
come from ``data/nvml_constants.tsv`` (see :mod:`.coverage`).
"""

from __future__ import annotations

from typing import Any

from gpu_exporter.simulator.errors import NvmlFailure
from gpu_exporter.simulator.nvml_base import (
    GPU_IS_LOST,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    FunctionsBase,
    out,
    val,
)

# nvmlDeviceGetPcieThroughput in KB/s: a floor of driver traffic plus host transfers that follow
# DRAM activity (an illustration, not a measurement: H100's Gen5 x16 link carries ~64 GB/s).
PCIE_IDLE_KBPS = {0: 800, 1: 1_200}  # NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES
PCIE_BUSY_KBPS = {0: 4_000_000, 1: 8_000_000}
HOPPER = 9  # NVML_DEVICE_ARCH_HOPPER: confidential computing from here on


class DeviceInfoFunctions(FunctionsBase):
    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: Any, value: Any) -> int:
        gpu = self.gpu(handle)
        kind = int(val(counter))
        if kind not in PCIE_IDLE_KBPS:
            raise NvmlFailure(INVALID_ARGUMENT)
        dram = gpu.activity_now("dram", self.now())
        out(value).value = round(PCIE_IDLE_KBPS[kind] + PCIE_BUSY_KBPS[kind] * dram)
        return SUCCESS

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        capability = self.device(handle).gpu.model.compute_capability
        if capability is None:
            raise NvmlFailure(NOT_SUPPORTED)
        out(major).value, out(minor).value = capability
        return SUCCESS

    def nvmlDeviceGetConfComputeMemSizeInfo(self, handle: Any, info: Any) -> int:
        """Confidential computing off (the default): nothing protected, all memory unprotected."""
        gpu = self.gpu(handle)
        if gpu.model.architecture < HOPPER:
            raise NvmlFailure(NOT_SUPPORTED)
        sizes = out(info)
        sizes.protectedMemSizeKib = 0
        sizes.unprotectedMemSizeKib = gpu.memory_total // 1024
        return SUCCESS

    def nvmlDeviceGetBAR1MemoryInfo(self, handle: Any, memory: Any) -> int:
        """The BAR1 aperture: the driver maps 1 MiB, plus 2 MiB per process (an approximation);
        a MIG instance gets the share of its memory (nvidia-smi lists BAR1 per instance)."""
        device = self.device(handle)
        gpu = device.gpu
        if gpu.model.bar1_mib is None:
            raise NvmlFailure(NOT_SUPPORTED)
        bar1 = out(memory)
        share = device.memory_total / gpu.memory_total if device is not gpu else 1.0
        bar1.bar1Total = round(gpu.model.bar1_mib * share) * 2**20
        processes = gpu.all_workloads() if device is gpu else device.workloads
        bar1.bar1Used = (1 + 2 * len(processes)) * 2**20
        bar1.bar1Free = bar1.bar1Total - bar1.bar1Used
        return SUCCESS

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any, limit: Any) -> int:
        out(limit).value = round(self.gpu(handle).model.power_limit_w * 1000)
        return SUCCESS

    def nvmlDeviceGetDefaultEccMode(self, handle: Any, mode: Any) -> int:
        out(mode).value = int(self.gpu(handle).model.ecc_default)
        return SUCCESS

    # ------------------------------------------------------------------ handle lookups

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id: Any, handle: Any) -> int:
        wanted = _bus_number(_text(bus_id))
        return self._point_at(handle, lambda gpu: gpu.bus == wanted)

    def nvmlDeviceGetHandleBySerial(self, serial: Any, handle: Any) -> int:
        wanted = _text(serial)
        return self._point_at(handle, lambda gpu: gpu.serial == wanted)

    def _point_at(self, handle: Any, matches: Any) -> int:
        for gpu in self.node.gpus:
            if matches(gpu):
                if gpu.lost:
                    raise NvmlFailure(GPU_IS_LOST)
                self.point(handle, gpu.handle)
                return SUCCESS
        raise NvmlFailure(NOT_FOUND)


def _text(arg: Any) -> str:
    value = val(arg)
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_number(bus_id: str) -> int | None:
    """The bus of ``[domain:]bus:device.function`` (NVML accepts both forms), None if malformed."""
    parts = bus_id.strip().split(":")
    try:
        return int(parts[-2], 16) if len(parts) >= 2 else None
    except ValueError:
        return None
