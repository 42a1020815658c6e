"""GPU processes and the containers they run in (the worker-thread side of memory accounting).

NVML lists the processes on each device with their memory (``usedGpuMemory`` may be None when
the driver cannot say, e.g. some MIG and vGPU setups). Each host PID's cgroup names its pod UID
(and container id); the pod log directories turn the UID into namespace, pod and container names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from ..devices import Device, DeviceId
from ..nvml import DeviceCalls, ErrorCounter, SupportRegistry
from .cgroups import CgroupOwner, PodName, read_command, read_pod_names, read_process_owner


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None
    mps: bool = False  # an MPS client (nvmlDeviceGetMPSComputeRunningProcesses)


ProcessLister = Callable[[Device], Sequence[GpuProcess]]


@dataclass(frozen=True)
class OwnedProcess:
    device: DeviceId
    pid: int
    used_bytes: int | None
    owner: CgroupOwner | None
    mps: bool = False
    command: str = ""  # /proc/<pid>/comm, read only for processes that hold nothing (status page)


@dataclass
class ScanResult:
    processes: list[OwnedProcess] = field(default_factory=list)
    compute_modes: dict[str, int] = field(default_factory=dict)  # GPU uuid -> NVML_COMPUTEMODE_*
    pods: dict[str, PodName] = field(default_factory=dict)  # pod UID -> names
    failed: list[str] = field(default_factory=list)  # device uuids whose listing failed


class NvmlProcessLister:
    """Compute and MPS client processes of one device, through DeviceCalls' error handling.

    MPS clients need ``nvmlDeviceGetMPSComputeRunningProcesses``; a driver or library without it
    (pynvml then raises a plain exception, not NotSupported) is remembered and not asked again.
    """

    def __init__(self, errors: ErrorCounter | None = None) -> None:
        self._support = SupportRegistry()
        self._errors = errors or ErrorCounter()
        self._mps = True

    def __call__(self, device: Device) -> Sequence[GpuProcess]:
        calls = self._calls(device)
        found = self._list(calls, pynvml.nvmlDeviceGetComputeRunningProcesses, device, {})
        if calls.failures:
            function, error = calls.failures[0]
            raise RuntimeError(f"{function}: {error}")
        if self._mps:
            mps_calls = self._calls(device)
            self._list(
                mps_calls, pynvml.nvmlDeviceGetMPSComputeRunningProcesses, device, found, mps=True
            )
            self._mps = not mps_calls.failures
        return list(found.values())

    def _calls(self, device: Device) -> DeviceCalls:
        return DeviceCalls(
            device.uuid,
            self._support,
            self._errors,
            collector="allocation",
            lost_uuid=device.gpu_uuid,
        )

    @staticmethod
    def _list(
        calls: DeviceCalls,
        function: Any,
        device: Device,
        found: dict[int, GpuProcess],
        *,
        mps: bool = False,
    ) -> dict[int, GpuProcess]:
        listed: Any = calls.get(function, device.handle)
        for info in listed or ():
            pid = int(info.pid)
            known = found.get(pid)
            used = _bytes(info.usedGpuMemory) if known is None else known.used_bytes
            found[pid] = GpuProcess(pid, used, mps or (known is not None and known.mps))
        return found


class ComputeModeReader:
    """``nvmlDeviceGetComputeMode`` of a whole GPU (exclusive-process mode is what MPS needs)."""

    def __init__(self, errors: ErrorCounter | None = None) -> None:
        self._support = SupportRegistry()
        self._errors = errors or ErrorCounter()

    def __call__(self, device: Device) -> int | None:
        calls = DeviceCalls(device.uuid, self._support, self._errors, collector="allocation")
        mode: Any = calls.get(pynvml.nvmlDeviceGetComputeMode, device.handle)
        return None if mode is None else int(mode)


def _bytes(value: Any) -> int | None:
    return None if value is None else int(value)


def scan(
    devices: Iterable[Device],
    lister: ProcessLister,
    proc_path: Path,
    pod_logs_path: Path,
    known_pods: Iterable[str],
    compute_mode: Callable[[Device], int | None] | None = None,
    held: frozenset[tuple[str, str]] = frozenset(),
    known: Mapping[tuple[str, int], OwnedProcess] | None = None,
) -> ScanResult:
    """List processes per device, find their pods; reads pod names only for unknown UIDs, and
    the command name of each process but those of pods holding the device (``held``: device
    uuid, pod UID). ``known``: the last scan's processes by device uuid and PID; one that did
    not change is found again as that object, not an equal new one (``ProcessOwners`` keeps a
    scan's state until the next: the garbage collector would move each new one to its old
    generation)."""
    known = known or {}
    result = ScanResult()
    for device in devices:
        try:
            mode = compute_mode(device) if compute_mode and not device.id.is_mig else None
            if mode is not None:
                result.compute_modes[device.uuid] = mode
            processes = lister(device)
        except Exception:  # DeviceLost included: the sampler handles the GPU; skip its processes
            result.failed.append(device.uuid)
            continue
        for process in processes:
            owner = read_process_owner(proc_path, process.pid)
            holds = owner is not None and (device.uuid, owner.pod_uid) in held
            command = "" if holds else read_command(proc_path, process.pid)
            owned = OwnedProcess(
                device.id, process.pid, process.used_bytes, owner, process.mps, command
            )
            before = known.get((device.uuid, process.pid))
            result.processes.append(before if before == owned else owned)
    uids = {p.owner.pod_uid for p in result.processes if p.owner is not None}
    if not uids <= set(known_pods):
        result.pods = read_pod_names(pod_logs_path)
    return result
