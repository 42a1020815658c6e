"""Fake NVML: process listings (compute, graphics, MPS) and per-process utilisation samples.

Per-process utilisation is modelled as the driver keeps it: one sample per running process every
``PROCESS_SAMPLE_PERIOD_S`` (the mean over that period), time-stamped in wall-clock microseconds,
held for ``PROCESS_SAMPLE_BUFFER_S``. A query returns the samples newer than the caller's
``lastSeenTimeStamp``, or NotFound when there are none (as real drivers do). A process's SM share
is its "kernel resident" utilisation, scaled so the shares on a time-sliced device sum to the
device's own (clamped) utilisation; memory shares likewise sum to the device's DRAM activity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpu_exporter.simulator.devices import Activity, MigDevice, Workload
from gpu_exporter.simulator.errors import NvmlFailure
from gpu_exporter.simulator.nvml_base import (
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    FunctionsBase,
    out,
    val,
    write_text,
)
from gpu_exporter.simulator.nvml_records import NO_INSTANCE
from gpu_exporter.simulator.patterns import integrate

PROCESS_SAMPLE_PERIOD_S = 1.0
PROCESS_SAMPLE_BUFFER_S = 30.0
PROCESSES_UTILIZATION_INFO_V1 = 0x01000018
MPS_SERVER_NAME = "nvidia-cuda-mps-server"
NOT_AVAILABLE_ULL = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    timestamp_us: int
    sm: int  # percent
    memory: int  # percent


class ProcessFunctions(FunctionsBase):
    # ------------------------------------------------------------------ listings

    def _listed(self, handle: Any, mps: bool) -> Sequence[tuple[Workload, MigDevice | None]]:
        device = self.device(handle)
        found: Sequence[tuple[Workload, MigDevice | None]]
        if isinstance(device, MigDevice):
            found = [(w, device) for w in device.workloads]
        else:
            self.privileged_parent(device)  # NoPermission on a MIG-enabled parent without root
            found = device.all_workloads()
        return [(w, m) for w, m in found if w.spec.mps == mps]

    def _fill(self, handle: Any, count: Any, infos: Any, mps: bool) -> int:
        """Compute processes (``mps=False``: MPS clients excluded, the MPS server listed) or
        MPS clients (``mps=True``), with the two-call size protocol."""
        processes = list(self._listed(handle, mps))
        servers = [] if mps else self.node.mps_servers(self.device(handle))
        # NVML_VALUE_NOT_AVAILABLE where the driver cannot say (pynvml turns it into None).
        rows = [
            (w.pid, w.spec.memory if w.spec.memory_reported else NOT_AVAILABLE_ULL, m)
            for w, m in processes
        ] + servers
        if not _fits(count, infos, len(rows)):
            return INSUFFICIENT_SIZE
        for i, (pid, memory, mig) in enumerate(rows):
            info = infos[i]
            info.pid = pid
            info.usedGpuMemory = memory
            info.gpuInstanceId = mig.spec.gpu_instance_id if mig else NO_INSTANCE
            info.computeInstanceId = 0 if mig else NO_INSTANCE
        return SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        return self._fill(handle, count, infos, mps=False)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any, count: Any, infos: Any) -> int:
        return self._fill(handle, count, infos, mps=False)

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(
        self, handle: Any, count: Any, infos: Any
    ) -> int:
        return self._fill(handle, count, infos, mps=True)

    def nvmlDeviceGetMPSComputeRunningProcesses_v2(
        self, handle: Any, count: Any, infos: Any
    ) -> int:
        return self._fill(handle, count, infos, mps=True)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        self.device(handle)
        _fits(count, infos, 0)  # compute-only workloads: no graphics contexts
        return SUCCESS

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Any, count: Any, infos: Any) -> int:
        return self.nvmlDeviceGetGraphicsRunningProcesses_v3(handle, count, infos)

    def nvmlSystemGetProcessName(self, pid: Any, name: Any, length: Any) -> int:
        wanted = int(val(pid))
        for gpu in self.node.gpus:
            for workload, _ in gpu.all_workloads():
                if workload.pid == wanted:
                    return write_text(name, length, workload.spec.process_name)
            if any(server_pid == wanted for server_pid, _, _ in self.node.mps_servers(gpu)):
                return write_text(name, length, MPS_SERVER_NAME)
        raise NvmlFailure(NOT_FOUND)

    # ------------------------------------------------------------------ per-process utilisation

    def _samples(self, handle: Any, last_seen_us: int) -> list[ProcessSample]:
        device = self.device(handle)
        if isinstance(device, MigDevice) or device.mig_enabled:
            raise NvmlFailure(NOT_SUPPORTED)  # not supported on MIG-enabled GPUs (nvml.h)
        samples = process_samples(device, self.now(), self.node.wall_origin, last_seen_us)
        if not samples:
            raise NvmlFailure(NOT_FOUND)
        return samples

    def nvmlDeviceGetProcessUtilization(
        self, handle: Any, utilization: Any, count: Any, last_seen: Any
    ) -> int:
        samples = self._samples(handle, int(val(last_seen)))
        if not _fits(count, utilization, len(samples)):
            return INSUFFICIENT_SIZE
        for i, sample in enumerate(samples):
            row = utilization[i]
            row.pid, row.timeStamp = sample.pid, sample.timestamp_us
            row.smUtil, row.memUtil, row.encUtil, row.decUtil = sample.sm, sample.memory, 0, 0
        return SUCCESS

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, info: Any) -> int:
        request = out(info)
        if request.version != PROCESSES_UTILIZATION_INFO_V1:
            raise NvmlFailure(INVALID_ARGUMENT)
        samples = self._samples(handle, int(request.lastSeenTimeStamp))
        capacity = int(request.processSamplesCount)
        request.processSamplesCount = len(samples)
        if not request.procUtilArray or capacity < len(samples):
            return INSUFFICIENT_SIZE
        for i, sample in enumerate(samples):
            row = request.procUtilArray[i]
            row.pid, row.timeStamp = sample.pid, sample.timestamp_us
            row.smUtil, row.memUtil = sample.sm, sample.memory
            row.encUtil = row.decUtil = row.jpgUtil = row.ofaUtil = 0
        return SUCCESS


def process_samples(
    device: Activity, now: float, wall_origin: float, last_seen_us: int
) -> list[ProcessSample]:
    """The samples a driver would still hold at ``now`` that are newer than ``last_seen_us``."""
    first = max(1, math.floor((now - PROCESS_SAMPLE_BUFFER_S) / PROCESS_SAMPLE_PERIOD_S) + 1)
    last = math.floor(now / PROCESS_SAMPLE_PERIOD_S)
    samples: list[ProcessSample] = []
    for k in range(first, last + 1):
        end = k * PROCESS_SAMPLE_PERIOD_S
        stamp = round((wall_origin + end) * 1e6)
        if stamp > last_seen_us:
            samples.extend(_period(device, end - PROCESS_SAMPLE_PERIOD_S, end, stamp))
    return samples


def _period(device: Activity, a: float, b: float, stamp: int) -> list[ProcessSample]:
    """One sample per process running at ``b``: its share of the device over [a, b]."""
    running = [w for w in device.workloads if w.origin < b]
    if not running:
        return []
    shares = {}
    for metric in ("util", "dram"):
        own = [_mean(w, metric, a, b) for w in running]
        total = integrate([w.signal(metric) for w in running], max(a, 0.0), b).integral / (b - a)
        scale = min(1.0, total / sum(own)) if sum(own) > 0 else 0.0
        # Truncated, so the shares' sum never exceeds the device's (clamped) activity.
        shares[metric] = [math.floor(100 * x * scale + 1e-9) for x in own]
    return [
        ProcessSample(w.pid, stamp, shares["util"][i], shares["dram"][i])
        for i, w in enumerate(running)
    ]


def _mean(workload: Workload, metric: Any, a: float, b: float) -> float:
    start = max(a, workload.origin)
    return integrate([workload.signal(metric)], start, b).integral / (b - a)


def _fits(count: Any, array: Any, needed: int) -> bool:
    """NVML's two-call protocol: report ``needed`` in ``count``; False when the array is short."""
    counter = out(count)
    capacity = int(counter.value)
    counter.value = needed
    return needed == 0 or (array is not None and capacity >= needed)
