"""Fake NVML: NVLink, PCIe link, GPU fabric, media engines and device state.

Errors follow what real devices answer (reference/nvml.md): NVLink calls on a GPU without NVLink
(PCIe cards) and fabric calls on a GPU without a fabric answer NotSupported; a link index beyond
NVML_NVLINK_MAX_LINKS is an invalid argument, one beyond the GPU's links NotSupported (an
assumption: docs/hardware-validation.md lists it to verify); the DL error counters answer
NotSupported on NVLink5 (Blackwell), whose counters are field values.
"""

from __future__ import annotations

from typing import Any

import pynvml

from gpu_exporter.simulator.devices import GpuDevice
from gpu_exporter.simulator.errors import NvmlFailure
from gpu_exporter.simulator.links import NvLink
from gpu_exporter.simulator.nvml_base import (
    ARGUMENT_VERSION_MISMATCH,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    FunctionsBase,
    out,
    val,
    write_text,
)

# nvmlNvLinkErrorCounter_t -> the simulator's counter name.
NVLINK_COUNTERS = {
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
    pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA: "ecc",
}
# NVML_TEMPERATURE_THRESHOLD_* -> the model's threshold name.
THRESHOLDS = {
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown",
    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown",
    pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "memory_max",
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max",
}
ENGINES = {"encoder": "encoders", "decoder": "decoders", "jpeg": "jpeg", "ofa": "ofa"}
ENGINE_SAMPLING_US = 167_000
# PCIe speed per lane in Mbps (nvmlDeviceGetPcieSpeed), per generation.
PCIE_SPEED_MBPS = {1: 2500, 2: 5000, 3: 8000, 4: 16000, 5: 32000, 6: 64000}
FABRIC_HEALTH_SUMMARY = {
    "healthy": pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
    "unhealthy": pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
    "limited_capacity": pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY,
}
# healthMask: degraded bandwidth TRUE (unhealthy / limited) or FALSE, other fields not reported.
DEGRADED_BW_TRUE = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
DEGRADED_BW_FALSE = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
FABRIC_V2 = pynvml.nvmlGpuFabricInfo_v2
FABRIC_V3 = pynvml.nvmlGpuFabricInfo_v3
NVSWITCH_BUSES = (0x05, 0x06, 0x07, 0x08)


class InterconnectFunctions(FunctionsBase):
    # ------------------------------------------------------------------ NVLink

    def _link(self, handle: Any, link: Any) -> tuple[GpuDevice, NvLink]:
        gpu = self.gpu(handle)
        if gpu.model.nvlink is None:
            raise NvmlFailure(NOT_SUPPORTED)
        index = int(val(link))
        if not 0 <= index < pynvml.NVML_NVLINK_MAX_LINKS:
            raise NvmlFailure(INVALID_ARGUMENT)
        if index >= len(gpu.links.nvlinks):
            raise NvmlFailure(NOT_SUPPORTED)
        return gpu, gpu.links.nvlinks[index]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, active: Any) -> int:
        out(active).value = int(self._link(handle, link)[1].active)
        return SUCCESS

    def nvmlDeviceGetNvLinkVersion(self, handle: Any, link: Any, version: Any) -> int:
        gpu, _ = self._link(handle, link)
        assert gpu.model.nvlink is not None
        out(version).value = gpu.model.nvlink.version
        return SUCCESS

    def nvmlDeviceGetNvLinkCapability(
        self, handle: Any, link: Any, capability: Any, result: Any
    ) -> int:
        self._link(handle, link)
        out(result).value = 1
        return SUCCESS

    def nvmlDeviceGetNvLinkErrorCounter(
        self, handle: Any, link: Any, counter: Any, value: Any
    ) -> int:
        gpu, nvlink = self._link(handle, link)
        name = NVLINK_COUNTERS.get(int(val(counter)))
        if name is None:
            raise NvmlFailure(INVALID_ARGUMENT)
        assert gpu.model.nvlink is not None
        if gpu.model.nvlink.version >= 5:
            raise NvmlFailure(NOT_SUPPORTED)
        out(value).value = nvlink.errors.get(name, 0)
        return SUCCESS

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: Any, kind: Any) -> int:
        gpu, _ = self._link(handle, link)
        switched = gpu.model.fabric != "none"
        out(kind).value = (
            pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
            if switched
            else pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        )
        return SUCCESS

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: Any, link: Any, pci: Any) -> int:
        _, _ = self._link(handle, link)
        index = int(val(link))
        bus = NVSWITCH_BUSES[index % len(NVSWITCH_BUSES)]
        result = out(pci)
        result.busIdLegacy = f"0000:{bus:02X}:00.0".encode()
        result.busId = f"00000000:{bus:02X}:00.0".encode()
        result.domain, result.bus, result.device = 0, bus, 0
        result.pciDeviceId = 0x22A310DE  # NVSwitch
        return SUCCESS

    # ------------------------------------------------------------------ PCIe

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any, generation: Any) -> int:
        gpu = self.gpu(handle)
        out(generation).value = gpu.links.pcie.generation(gpu.idle_now(self.now()))
        return SUCCESS

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any, generation: Any) -> int:
        out(generation).value = self.gpu(handle).links.pcie.max_generation
        return SUCCESS

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: Any, generation: Any) -> int:
        out(generation).value = self.gpu(handle).model.pcie_generation
        return SUCCESS

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any, width: Any) -> int:
        out(width).value = self.gpu(handle).links.pcie.width
        return SUCCESS

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any, width: Any) -> int:
        out(width).value = self.gpu(handle).links.pcie.max_width
        return SUCCESS

    def nvmlDeviceGetPcieSpeed(self, handle: Any, speed: Any) -> int:
        gpu = self.gpu(handle)
        generation = gpu.links.pcie.generation(gpu.idle_now(self.now()))
        out(speed).value = PCIE_SPEED_MBPS[generation]
        return SUCCESS

    def nvmlDeviceGetPcieLinkMaxSpeed(self, handle: Any, speed: Any) -> int:
        out(speed).value = PCIE_SPEED_MBPS[self.gpu(handle).links.pcie.max_generation]
        return SUCCESS

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any, value: Any) -> int:
        out(value).value = self.gpu(handle).links.pcie.replays
        return SUCCESS

    # ------------------------------------------------------------------ fabric

    def _fabric(self, handle: Any, info: Any) -> tuple[GpuDevice, Any]:
        gpu = self.gpu(handle)
        if gpu.links.fabric is None:
            raise NvmlFailure(NOT_SUPPORTED)
        result = out(info)
        fabric = gpu.links.fabric
        for i, byte in enumerate(fabric.cluster_uuid):
            result.clusterUuid[i] = byte
        result.status = SUCCESS
        result.cliqueId = fabric.clique_id
        result.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        return gpu, result

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> int:
        self._fabric(handle, info)
        return SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        version = out(info).version
        if version not in (FABRIC_V2, FABRIC_V3):
            raise NvmlFailure(ARGUMENT_VERSION_MISMATCH)
        gpu, result = self._fabric(handle, info)
        fabric = gpu.links.fabric
        assert fabric is not None
        if fabric.kind != "nvl":  # HGX boards report state only, no health
            result.healthMask = 0
            if version == FABRIC_V3:
                result.healthSummary = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED
            return SUCCESS
        degraded = fabric.health != "healthy"
        result.healthMask = DEGRADED_BW_TRUE if degraded else DEGRADED_BW_FALSE
        if version == FABRIC_V3:
            result.healthSummary = FABRIC_HEALTH_SUMMARY[fabric.health]
        return SUCCESS

    # ------------------------------------------------------------------ engines

    def nvmlDeviceGetJpgUtilization(self, handle: Any, value: Any, period: Any) -> int:
        return engine_utilization(self.gpu(handle), "jpeg", value, period)

    def nvmlDeviceGetOfaUtilization(self, handle: Any, value: Any, period: Any) -> int:
        return engine_utilization(self.gpu(handle), "ofa", value, period)

    # ------------------------------------------------------------------ device state

    def nvmlDeviceGetPersistenceMode(self, handle: Any, mode: Any) -> int:
        out(mode).value = int(self.gpu(handle).persistence_mode)
        return SUCCESS

    def nvmlDeviceGetComputeMode(self, handle: Any, mode: Any) -> int:
        out(mode).value = self.gpu(handle).compute_mode
        return SUCCESS

    def nvmlDeviceGetVbiosVersion(self, handle: Any, buffer: Any, length: Any) -> int:
        return write_text(buffer, length, self.gpu(handle).model.vbios)

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: Any, temp: Any) -> int:
        gpu = self.gpu(handle)
        name = THRESHOLDS.get(int(val(threshold)))
        if name is None or name not in gpu.model.thresholds:
            raise NvmlFailure(NOT_SUPPORTED)
        out(temp).value = gpu.model.thresholds[name]
        return SUCCESS


def engine_utilization(gpu: GpuDevice, engine: str, value: Any, period: Any) -> int:
    """``nvmlDevice<Engine>Utilization``: NotSupported where the model has no such engine."""
    if not gpu.model.engines.get(ENGINES[engine], 0):
        raise NvmlFailure(NOT_SUPPORTED)
    out(value).value = 0  # no simulated workload uses the media engines
    out(period).value = ENGINE_SAMPLING_US
    return SUCCESS
