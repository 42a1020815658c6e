"""Fake NVML: library lifetime, system information, identity and MIG topology."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from gpu_exporter.simulator.devices import GpuDevice, MigDevice
from gpu_exporter.simulator.errors import NvmlFailure
from gpu_exporter.simulator.models import MIG_SLICES, MigProfile
from gpu_exporter.simulator.nvml_base import (
    ARGUMENT_VERSION_MISMATCH,
    GPU_IS_LOST,
    INVALID_ARGUMENT,
    NO_PERMISSION,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    UNINITIALIZED,
    FunctionsBase,
    out,
    val,
    write_text,
)

PCI_SUBSYSTEM_ID = 0x16C110DE


class IdentityFunctions(FunctionsBase):
    # ------------------------------------------------------------------ lifetime and system

    def nvmlInitWithFlags(self, flags: Any) -> int:
        self.node.init_count += 1
        return SUCCESS

    def nvmlInit_v2(self) -> int:
        return self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> int:
        if self.node.init_count == 0:
            return UNINITIALIZED
        self.node.init_count -= 1
        return SUCCESS

    def nvmlSystemGetDriverVersion(self, buffer: Any, length: Any) -> int:
        return write_text(buffer, length, self.node.scenario.node.driver_version)

    def nvmlSystemGetNVMLVersion(self, buffer: Any, length: Any) -> int:
        node = self.node.scenario.node
        cuda_major = node.cuda_version.split(".")[0]
        return write_text(buffer, length, f"{cuda_major}.{node.driver_version}")

    def nvmlSystemGetCudaDriverVersion(self, version: Any) -> int:
        major, minor = self.node.scenario.node.cuda_version.split(".")
        out(version).value = int(major) * 1000 + int(minor) * 10
        return SUCCESS

    def nvmlSystemGetCudaDriverVersion_v2(self, version: Any) -> int:
        return self.nvmlSystemGetCudaDriverVersion(version)

    # ------------------------------------------------------------------ handles

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        out(count).value = len(self.node.visible_gpus)
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, handle: Any) -> int:
        i = int(val(index))
        visible = self.node.visible_gpus
        if not 0 <= i < len(visible):
            raise NvmlFailure(INVALID_ARGUMENT)
        gpu = visible[i]
        if gpu.lost:
            raise NvmlFailure(GPU_IS_LOST)
        self.point(handle, gpu.handle)
        return SUCCESS

    def nvmlDeviceGetHandleByUUID(self, uuid: Any, handle: Any) -> int:
        wanted = val(uuid)
        wanted = wanted.decode() if isinstance(wanted, bytes) else str(wanted)
        for gpu in self.node.visible_gpus:
            devices: list[GpuDevice | MigDevice] = [gpu, *gpu.migs]
            for device in devices:
                if device.uuid == wanted:
                    if gpu.lost:
                        raise NvmlFailure(GPU_IS_LOST)
                    self.point(handle, device.handle)
                    return SUCCESS
        raise NvmlFailure(NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any, index: Any) -> int:
        out(index).value = self.node.visible_gpus.index(self.gpu(handle))
        return SUCCESS

    def nvmlDeviceGetMinorNumber(self, handle: Any, minor: Any) -> int:
        # /dev/nvidia<minor>; a MIG handle has no device node of its own (NotSupported)
        out(minor).value = self.gpu(handle).spec.device_minor
        return SUCCESS

    # ------------------------------------------------------------------ identity

    def nvmlDeviceGetUUID(self, handle: Any, buffer: Any, length: Any) -> int:
        return write_text(buffer, length, self.device(handle).uuid)

    def nvmlDeviceGetName(self, handle: Any, buffer: Any, length: Any) -> int:
        device = self.device(handle)
        name = device.gpu.model.name
        if isinstance(device, MigDevice):
            name = f"{name} MIG {device.spec.profile.name}"
        return write_text(buffer, length, name)

    def nvmlDeviceGetSerial(self, handle: Any, buffer: Any, length: Any) -> int:
        return write_text(buffer, length, self.device(handle).gpu.serial)

    def nvmlDeviceGetPciInfo_v3(self, handle: Any, info: Any) -> int:
        gpu = self.device(handle).gpu
        pci = out(info)
        pci.busIdLegacy = f"0000:{gpu.bus:02X}:00.0".encode()
        pci.busId = gpu.bus_id.encode()
        pci.domain, pci.bus, pci.device = 0, gpu.bus, 0
        pci.pciDeviceId = gpu.model.pci_device_id
        pci.pciSubSystemId = PCI_SUBSYSTEM_ID
        return SUCCESS

    def nvmlDeviceGetArchitecture(self, handle: Any, arch: Any) -> int:
        out(arch).value = self.device(handle).gpu.model.architecture
        return SUCCESS

    # ------------------------------------------------------------------ MIG

    def _mig_capable(self, handle: Any) -> GpuDevice:
        gpu = self.gpu(handle)
        if not gpu.model.supports_mig:
            raise NvmlFailure(NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        mode = int(self._mig_capable(handle).mig_enabled)
        out(current).value = mode
        out(pending).value = mode
        return SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, count: Any) -> int:
        gpu = self._mig_capable(handle)
        # 0 while MIG mode is off (a MIG-capable GPU then has no MIG device slots at all).
        out(count).value = MIG_SLICES if gpu.mig_enabled else 0
        return SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, mig: Any) -> int:
        gpu = self._mig_capable(handle)
        i = int(val(index))
        if not 0 <= i < MIG_SLICES:
            raise NvmlFailure(INVALID_ARGUMENT)
        if i >= len(gpu.migs):
            raise NvmlFailure(NOT_FOUND)
        self.point(mig, gpu.migs[i].handle)
        return SUCCESS

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any, is_mig: Any) -> int:
        out(is_mig).value = int(isinstance(self.device(handle), MigDevice))
        return SUCCESS

    def _mig(self, handle: Any) -> MigDevice:
        device = self.device(handle)
        if not isinstance(device, MigDevice):
            raise NvmlFailure(NOT_SUPPORTED)
        return device

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, parent: Any) -> int:
        device = self.device(handle)
        if not isinstance(device, MigDevice):
            raise NvmlFailure(INVALID_ARGUMENT)
        self.point(parent, device.parent.handle)
        return SUCCESS

    def nvmlDeviceGetGpuInstanceId(self, handle: Any, gi: Any) -> int:
        out(gi).value = self._mig(handle).spec.gpu_instance_id
        return SUCCESS

    def nvmlDeviceGetComputeInstanceId(self, handle: Any, ci: Any) -> int:
        self._mig(handle)
        out(ci).value = 0
        return SUCCESS

    def _instance(self, gpu: GpuDevice, gi: int) -> MigDevice:
        for mig in gpu.migs:
            if mig.spec.gpu_instance_id == gi:
                return mig
        raise NvmlFailure(NOT_FOUND)

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi: Any, instance: Any) -> int:
        gpu = self._mig_capable(handle)
        if not gpu.mig_enabled:
            raise NvmlFailure(NOT_SUPPORTED)
        if not self.node.scenario.node.privileged:
            raise NvmlFailure(NO_PERMISSION)  # nvml.h: GPU instance queries need root
        self.point(instance, self._instance(gpu, int(val(gi))).gi_handle)
        return SUCCESS

    def nvmlGpuInstanceGetInfo(self, instance: Any, info: Any) -> int:
        try:
            mig = self.node.gpu_instances.get(ctypes.addressof(instance.contents))
        except (ValueError, TypeError, AttributeError):
            mig = None
        if mig is None:
            raise NvmlFailure(INVALID_ARGUMENT)
        if mig.parent.lost:
            raise NvmlFailure(GPU_IS_LOST)
        result = out(info)
        result.device = ctypes.pointer(mig.parent.handle)
        result.id = mig.spec.gpu_instance_id
        result.profileId = mig.spec.profile.profile_id
        result.placement.start = mig.spec.start_slice
        result.placement.size = mig.spec.profile.slices
        return SUCCESS

    def _profile(self, handle: Any, profile_id: Any) -> MigProfile:
        gpu = self._mig_capable(handle)
        wanted = int(val(profile_id))
        valid = 0 <= wanted < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
        if not gpu.mig_enabled:
            # nvml.h: NOT_SUPPORTED "if device doesn't have MIG mode enabled or profile isn't
            # supported" (a MIG-capable GPU with MIG off lists no profiles).
            raise NvmlFailure(NOT_SUPPORTED if valid else INVALID_ARGUMENT)
        for profile in gpu.model.mig_profiles.values():
            if profile.profile_id == wanted:
                return profile
        # A profile NVML defines that this GPU lacks is NotSupported; beyond them, invalid.
        raise NvmlFailure(NOT_SUPPORTED if valid else INVALID_ARGUMENT)

    def nvmlDeviceGetGpuInstanceProfileInfoByIdV(self, handle: Any, pid: Any, info: Any) -> int:
        profile = self._profile(handle, pid)
        result = out(info)
        if result.version != pynvml.nvmlGpuInstanceProfileInfo_v2:
            raise NvmlFailure(ARGUMENT_VERSION_MISMATCH)
        result.id = profile.profile_id
        result.isP2pSupported = 0
        result.sliceCount = profile.slices
        result.instanceCount = profile.instances
        result.multiprocessorCount = profile.sms
        result.copyEngineCount = max(1, profile.slices)
        result.decoderCount, result.jpegCount, result.ofaCount = media_engines(profile)
        result.encoderCount = 0
        result.memorySizeMB = profile.memory_mib
        result.name = f"MIG {profile.name}".encode()
        return SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, pid: Any, info: Any) -> int:
        return self.nvmlDeviceGetGpuInstanceProfileInfoByIdV(handle, pid, info)

    def nvmlDeviceGetAttributes_v2(self, handle: Any, attributes: Any) -> int:
        """What a MIG device (or a whole GPU) is made of; needs no privileges (nvml.h)."""
        device = self.device(handle)
        result = out(attributes)
        if isinstance(device, MigDevice):
            profile = device.spec.profile
            result.multiprocessorCount = profile.sms
            result.sharedCopyEngineCount = max(1, profile.slices)
            decoders, jpegs, ofas = media_engines(profile)
            result.sharedDecoderCount, result.sharedJpegCount, result.sharedOfaCount = (
                decoders,
                jpegs,
                ofas,
            )
            result.sharedEncoderCount = 0
            result.gpuInstanceSliceCount = result.computeInstanceSliceCount = profile.slices
            result.memorySizeMB = profile.memory_mib
            return SUCCESS
        model = device.model
        result.multiprocessorCount = model.sm_count
        result.sharedCopyEngineCount = MIG_SLICES
        result.sharedDecoderCount = result.sharedJpegCount = result.sharedOfaCount = 0
        result.sharedEncoderCount = 0
        result.gpuInstanceSliceCount = result.computeInstanceSliceCount = MIG_SLICES
        result.memorySizeMB = model.memory_mib
        return SUCCESS


def media_engines(profile: MigProfile) -> tuple[int, int, int]:
    """(decoders, JPEG, OFA) of an instance: about one decoder per two slices (invented)."""
    return profile.slices // 2, profile.slices // 2, profile.slices // 2
