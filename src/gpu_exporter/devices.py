"""Device discovery: whole GPUs and MIG instances, their identity, and what they support.

Discovery runs on a worker thread at startup and on the slow cadence (MIG layouts can change at
run time). Each device's Prometheus label string is rendered once here and reused by every
sample.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import pynvml

from .exposition import label_string
from .migprofiles import profile_from_attributes
from .nvml import (
    DeviceCalls,
    DeviceLost,
    ErrorCounter,
    NvmlUnavailable,
    SupportRegistry,
    error_name,
)
from .nvml.errors import is_unavailable


@dataclass(frozen=True)
class DeviceId:
    """What identifies a device and labels its series. A MIG instance has a parent."""

    index: int  # NVML index of the GPU (the parent's, for a MIG instance)
    uuid: str
    model: str = ""
    pci_bus_id: str = ""
    mig_mode: str = "disabled"  # enabled | disabled | unsupported
    gpm_supported: bool = False
    # A DCGM host engine watches this device's profiling fields (known after it connects; the
    # sampler rediscovers when that changes, so the device's jobs and gpu_info follow).
    dcgm_served: bool = False
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_profile: str | None = None
    # Whole GPUs: state that explains faults and identifies the board for an RMA (gpu_info).
    persistence_mode: str = ""  # enabled | disabled ("" unknown)
    compute_mode: str = ""  # default | exclusive_process | prohibited
    serial: str = ""
    vbios_version: str = ""
    # The GPU's device minor (/dev/nvidia<minor>; the parent's for a MIG instance): how CDI specs
    # and DRA device names refer to it. None when NVML does not say.
    minor: int | None = None
    # MIG: (GPU instance profile id, placement start, placement size), as DRA device names say.
    placement: tuple[int, int, int] | None = None

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None

    @property
    def layout(self) -> DeviceId:
        """The identity without the state that may change under a running GPU (modes, firmware):
        a change of layout rebuilds the device's collectors, a change of state only relabels."""
        return replace(self, persistence_mode="", compute_mode="", serial="", vbios_version="")

    @cached_property
    def labels(self) -> str:
        """``gpu``/``uuid`` (+ the MIG instance labels) rendered once for every series."""
        pairs = [("gpu", str(self.index)), ("uuid", self.uuid)]
        if self.is_mig:
            pairs += [
                ("gpu_instance_id", str(self.gpu_instance_id)),
                ("compute_instance_id", str(self.compute_instance_id)),
                ("mig_profile", self.mig_profile or ""),
            ]
        return label_string(pairs)


def activity_source_name(device: DeviceId) -> str:
    """Which activity source ``device`` uses (``gpu_info``'s ``activity_source``): ``gpm``
    wherever the GPU has GPM, else ``dcgm`` where a DCGM host engine serves it, else ``none``.
    Decided per device at discovery: the activity collectors read from the source it names."""
    if device.gpm_supported:
        return "gpm"
    return "dcgm" if device.dcgm_served else "none"


def idle_activity_source(device: DeviceId) -> str:
    """The signal idle accounting prefers for ``device`` (``gpu_info``'s ``idle_source`` names
    it): its activity source (SM activity), else NVML utilisation on a whole GPU; ``none`` on a
    MIG instance without an activity source.

    A preference, not the last word: while the ledger has no point of the preferred signal for
    the device (GPM's first sample, a DCGM outage), accounting judges it by whichever signal the
    ledger does have (``allocation/accounting.py``, ``IdleAccountant._activity_state``)."""
    source = activity_source_name(device)
    if source != "none":
        return source
    return "none" if device.is_mig else "utilization"


def idle_source_label(device: DeviceId) -> str:
    """``gpu_info``'s ``idle_source``: ``sm_active``, ``utilization`` or ``none``."""
    source = idle_activity_source(device)
    return "sm_active" if source in ("gpm", "dcgm") else source


@dataclass(eq=False)
class Device:
    """A device as this process sees it: identity plus its (process-local) NVML handle."""

    id: DeviceId
    handle: Any
    parent: Device | None = None

    @property
    def uuid(self) -> str:
        return self.id.uuid

    @property
    def gpu_uuid(self) -> str:
        """The whole GPU this device belongs to: itself, or a MIG instance's parent."""
        return self.id.parent_uuid or self.id.uuid


@dataclass
class Gpu:
    """A whole GPU and its MIG instances (empty unless MIG mode is on)."""

    device: Device
    mig_devices: list[Device] = field(default_factory=list)

    def devices(self) -> Iterator[Device]:
        yield self.device
        yield from self.mig_devices


@dataclass(frozen=True)
class SystemInfo:
    driver_version: str
    nvml_version: str
    gpu_count: int


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def init_nvml() -> SystemInfo:
    """``nvmlInit`` (blocking: a worker thread), then the system's versions and GPU count.
    :class:`NvmlUnavailable` when there is no library or driver to use at all."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if is_unavailable(exc):
            raise NvmlUnavailable(str(exc)) from exc
        raise
    return read_system_info()


def read_system_info() -> SystemInfo:
    """Driver/NVML versions and the GPU count (raises on failure: there is no node without it)."""
    return SystemInfo(
        driver_version=_text(pynvml.nvmlSystemGetDriverVersion()),
        nvml_version=_text(pynvml.nvmlSystemGetNVMLVersion()),
        gpu_count=int(pynvml.nvmlDeviceGetCount()),
    )


def discover_gpu(
    index: int,
    support: SupportRegistry,
    errors: ErrorCounter,
    dcgm_served: Container[str] = (),
) -> Gpu:
    """Identify GPU ``index`` and its MIG instances. Raises DeviceLost when it does not answer.

    ``dcgm_served``: the UUIDs a DCGM host engine serves activity for (see ``DcgmLink``)."""
    function = "nvmlDeviceGetHandleByIndex"
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        function = "nvmlDeviceGetUUID"
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
    except pynvml.NVMLError as exc:
        errors.add(function, error_name(exc))  # so a failed re-probe of a lost GPU shows
        raise DeviceLost(f"index:{index}", function) from exc
    calls = DeviceCalls(uuid, support, errors, collector="discovery")
    model = calls.get(pynvml.nvmlDeviceGetName, handle)
    pci = calls.get(pynvml.nvmlDeviceGetPciInfo, handle)
    mig = calls.get(pynvml.nvmlDeviceGetMigMode, handle)
    gpm = calls.get(pynvml.nvmlGpmQueryDeviceSupport, handle)
    minor = calls.get(pynvml.nvmlDeviceGetMinorNumber, handle)
    mig_enabled = mig is not None and int(mig[0]) == pynvml.NVML_DEVICE_MIG_ENABLE
    gpu_id = DeviceId(
        index=index,
        uuid=uuid,
        model=_text(model) if model is not None else "",
        pci_bus_id=_text(pci.busId) if pci is not None else "",
        mig_mode="unsupported" if mig is None else ("enabled" if mig_enabled else "disabled"),
        gpm_supported=gpm is not None and bool(gpm.isSupportedDevice),
        minor=int(minor) if minor is not None else None,
        dcgm_served=uuid in dcgm_served,
    )
    persistence, compute, serial, vbios = read_state(calls, handle)
    gpu_id = replace(
        gpu_id,
        persistence_mode=persistence,
        compute_mode=compute,
        serial=serial,
        vbios_version=vbios,
    )
    gpu = Gpu(Device(gpu_id, handle))
    if mig_enabled:
        gpu.mig_devices = list(_discover_mig(gpu.device, calls, dcgm_served))
    return gpu


def _discover_mig(
    parent: Device, calls: DeviceCalls, dcgm_served: Container[str]
) -> Iterator[Device]:
    count = calls.get(pynvml.nvmlDeviceGetMaxMigDeviceCount, parent.handle) or 0
    for slot in range(int(count)):
        # NotFound (an empty slot) comes back as None.
        handle = calls.get(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, parent.handle, slot)
        if handle is None:
            continue
        uuid = calls.get(pynvml.nvmlDeviceGetUUID, handle, signal=f"mig{slot}.uuid")
        gi = calls.get(pynvml.nvmlDeviceGetGpuInstanceId, handle)
        ci = calls.get(pynvml.nvmlDeviceGetComputeInstanceId, handle)
        if uuid is None or gi is None or ci is None:
            continue
        info = _gpu_instance_info(parent, int(gi), calls)
        mig_id = DeviceId(
            index=parent.id.index,
            uuid=_text(uuid),
            model=parent.id.model,
            pci_bus_id=parent.id.pci_bus_id,
            mig_mode="enabled",
            gpm_supported=parent.id.gpm_supported,
            dcgm_served=_text(uuid) in dcgm_served,
            parent_uuid=parent.uuid,
            gpu_instance_id=int(gi),
            compute_instance_id=int(ci),
            mig_profile=_mig_profile(parent, handle, info, calls),
            minor=parent.id.minor,
            placement=(
                (int(info.profileId), int(info.placement.start), int(info.placement.size))
                if info is not None
                else None
            ),
        )
        yield Device(mig_id, handle, parent)


def _gpu_instance_info(parent: Device, gpu_instance_id: int, calls: DeviceCalls) -> Any:
    """The GPU instance's profile id and placement (``nvmlGpuInstanceInfo_t``), or None."""
    instance = calls.get(pynvml.nvmlDeviceGetGpuInstanceById, parent.handle, gpu_instance_id)
    return calls.get(pynvml.nvmlGpuInstanceGetInfo, instance) if instance is not None else None


def _mig_profile(parent: Device, handle: Any, info: Any, calls: DeviceCalls) -> str:
    """The profile name (``1g.10gb``) as NVML names it, else matched from the attributes."""
    if info is not None:
        profile = calls.get(
            pynvml.nvmlDeviceGetGpuInstanceProfileInfoById, parent.handle, info.profileId
        )
        if profile is not None:
            return _text(profile.name).removeprefix("MIG ").strip()
    # Reading GPU instances needs privileges the exporter may lack; the attributes do not.
    return profile_from_attributes(parent.handle, handle, calls)


COMPUTE_MODES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "default",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "exclusive_thread",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "prohibited",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "exclusive_process",
}


def read_state(calls: DeviceCalls, handle: Any) -> tuple[str, str, str, str]:
    """Persistence and compute mode, serial and VBIOS of a whole GPU ("" where unreadable)."""
    persistence = calls.get(pynvml.nvmlDeviceGetPersistenceMode, handle)
    compute = calls.get(pynvml.nvmlDeviceGetComputeMode, handle)
    serial = calls.get(pynvml.nvmlDeviceGetSerial, handle)
    vbios = calls.get(pynvml.nvmlDeviceGetVbiosVersion, handle)
    return (
        "" if persistence is None else ("enabled" if persistence else "disabled"),
        "" if compute is None else COMPUTE_MODES.get(int(compute), str(compute)),
        "" if serial is None else _text(serial),
        "" if vbios is None else _text(vbios),
    )
