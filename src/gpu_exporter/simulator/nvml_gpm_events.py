"""Fake NVML: GPM samples and metrics, and NVML event sets."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import pynvml

from gpu_exporter.simulator.devices import Device, GpuDevice
from gpu_exporter.simulator.errors import NvmlFailure
from gpu_exporter.simulator.models import GpuModel
from gpu_exporter.simulator.nvml_base import (
    ARGUMENT_VERSION_MISMATCH,
    GPU_IS_LOST,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    TIMEOUT,
    FunctionsBase,
    out,
    val,
)
from gpu_exporter.simulator.nvml_records import (
    DOUBLE_BIT_ECC_EVENT,
    SINGLE_BIT_ECC_EVENT,
    XID_EVENT,
    EventSet,
    GpmSample,
    QueuedEvent,
)

# GPM metric id -> the activity integral it reports (percent of the interval).
GPM_ACTIVITY = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: "util",
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "occupancy",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor",
    pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: "tensor",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram",
}
# The non-tensor pipes' share of SM activity (a mixed training workload: mostly FP32 and integer
# address arithmetic, some FP16 outside the tensor cores, a trace of FP64).
GPM_PIPE_SHARES = {
    pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.02,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: 0.4,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: 0.15,
    pynvml.NVML_GPM_METRIC_INTEGER_UTIL: 0.25,
}
# Media engine instances: GPM metric id of instance 0 and the model's engine count key.
GPM_ENGINES = {
    pynvml.NVML_GPM_METRIC_NVENC_0_UTIL: ("encoders", 4),
    pynvml.NVML_GPM_METRIC_NVDEC_0_UTIL: ("decoders", 8),
    pynvml.NVML_GPM_METRIC_NVJPG_0_UTIL: ("jpeg", 8),
    pynvml.NVML_GPM_METRIC_NVOFA_0_UTIL: ("ofa", 2),
}
# Pipes and links the simulator does not model read as idle rather than unsupported.
GPM_ZERO = frozenset({6, 8, 9, 20, 21, 60, 61})
GPM_MIN_SPACING_S = 0.1
PSTATE_EVENT = 0x4
CLOCK_EVENT = 0x10


class RawGpmMetric(ctypes.Structure):
    """``c_nvmlGpmMetric_t`` as plain ctypes: pynvml's struct runs Python code on every member
    read and write, ~3,000 a round on a 64-device node (tests check the layouts agree)."""

    _fields_ = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_double),
        ("metricInfo", ctypes.c_void_p * 3),  # names and unit: the caller's, never written
    ]


class GpmEventFunctions(FunctionsBase):
    # ------------------------------------------------------------------ GPM

    def _gpm_gpu(self, handle: Any) -> GpuDevice:
        gpu = self.gpu(handle)
        if not gpu.model.gpm:
            raise NvmlFailure(NOT_SUPPORTED)
        return gpu

    def nvmlGpmQueryDeviceSupport(self, handle: Any, support: Any) -> int:
        device = self.device(handle)
        result = out(support)
        if result.version != pynvml.NVML_GPM_SUPPORT_VERSION:
            raise NvmlFailure(ARGUMENT_VERSION_MISMATCH)
        result.isSupportedDevice = int(device.gpu.model.gpm)
        return SUCCESS

    def nvmlGpmSampleAlloc(self, sample: Any) -> int:
        handle = pynvml.struct_c_nvmlGpmSample_t()
        self.node.gpm_samples[ctypes.addressof(handle)] = GpmSample()
        self.point(sample, handle)
        return SUCCESS

    def _sample_key(self, sample: Any) -> int:
        try:
            key = ctypes.addressof(sample.contents)
        except (ValueError, TypeError, AttributeError):
            raise NvmlFailure(INVALID_ARGUMENT) from None
        if key not in self.node.gpm_samples:
            raise NvmlFailure(INVALID_ARGUMENT)
        return key

    def nvmlGpmSampleFree(self, sample: Any) -> int:
        key = self._sample_key(sample)
        del self.node.gpm_samples[key]
        self.release(sample.contents)
        return SUCCESS

    def _record(self, device: Device, sample: Any) -> int:
        recorded = self.node.gpm_samples[self._sample_key(sample)]
        self.node.advance(gpu=device.gpu)
        acc = device.acc
        recorded.device = device
        recorded.t = self.node.integrated_at(device.gpu)  # the counters' time, not the call's
        recorded.integrals = {
            "sm": acc.sm,
            "occupancy": acc.occupancy,
            "tensor": acc.tensor,
            "dram": acc.dram,
            "util": acc.util,
        }
        return SUCCESS

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> int:
        return self._record(self._gpm_gpu(handle), sample)

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: Any, sample: Any) -> int:
        gpu = self._gpm_gpu(handle)
        wanted = int(val(gpu_instance_id))
        for mig in gpu.migs:
            if mig.spec.gpu_instance_id == wanted:
                return self._record(mig, sample)
        raise NvmlFailure(NOT_FOUND)

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> int:
        request = out(metrics_get)
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise NvmlFailure(ARGUMENT_VERSION_MISMATCH)
        first = self.node.gpm_samples[self._sample_key(request.sample1)]
        second = self.node.gpm_samples[self._sample_key(request.sample2)]
        if first.device is None or first.device is not second.device:
            raise NvmlFailure(INVALID_ARGUMENT)  # a sample never taken, or two devices' samples
        if first.device.gpu.lost:
            raise NvmlFailure(GPU_IS_LOST)
        # GPM needs sample2 taken more than 100 ms after sample1 (reference/nvml.md). Closer,
        # equal or reversed samples are refused as a whole; the code a real driver answers
        # there (InvalidArgument here) is unverified: the hardware check prints it.
        if second.t - first.t <= GPM_MIN_SPACING_S:
            raise NvmlFailure(INVALID_ARGUMENT)
        count = int(request.numMetrics)
        model = first.device.gpu.model
        for metric in (RawGpmMetric * count).from_address(ctypes.addressof(request.metrics)):
            _fill_metric(metric, first, second, model)
        return SUCCESS

    # ------------------------------------------------------------------ events

    def _event_set(self, handle: Any) -> EventSet:
        try:
            event_set = self.node.event_sets.get(ctypes.addressof(handle.contents))
        except (ValueError, TypeError, AttributeError):
            event_set = None
        if event_set is None:
            raise NvmlFailure(INVALID_ARGUMENT)
        return event_set

    def nvmlEventSetCreate(self, handle: Any) -> int:
        event_set = EventSet()
        self.node.event_sets[ctypes.addressof(event_set.handle)] = event_set
        self.point(handle, event_set.handle)
        return SUCCESS

    def _supported_events(self, gpu: GpuDevice) -> int:
        ecc = SINGLE_BIT_ECC_EVENT | DOUBLE_BIT_ECC_EVENT if gpu.spec.ecc else 0
        return XID_EVENT | PSTATE_EVENT | CLOCK_EVENT | ecc

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any, types: Any) -> int:
        out(types).value = self._supported_events(self.gpu(handle))
        return SUCCESS

    def nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        gpu = self.gpu(handle)
        mask = int(val(types))
        if mask & ~self._supported_events(gpu):
            raise NvmlFailure(NOT_SUPPORTED)
        target = self._event_set(event_set)
        target.masks[gpu.index] = target.masks.get(gpu.index, 0) | mask
        return SUCCESS

    def nvmlEventSetFree(self, handle: Any) -> int:
        event_set = self._event_set(handle)
        del self.node.event_sets[ctypes.addressof(event_set.handle)]
        self.release(event_set.handle)
        with event_set.condition:
            event_set.freed = True
            event_set.condition.notify_all()
        return SUCCESS

    def nvmlEventSetWait_v2(self, handle: Any, data: Any, timeout_ms: Any) -> int:
        """Block (without the node lock) until an event, the timeout, or the node closes."""
        with self.node.lock:
            event_set = self._event_set(handle)
        event = self._next_event(event_set, time.monotonic() + int(val(timeout_ms)) / 1000)
        if event.lost:
            raise NvmlFailure(GPU_IS_LOST)
        result = out(data)
        result.device = ctypes.pointer(event.device.handle) if event.device else None
        result.eventType = event.event_type
        result.eventData = event.data
        result.gpuInstanceId = event.gpu_instance_id
        result.computeInstanceId = event.compute_instance_id
        return SUCCESS

    def _next_event(self, event_set: EventSet, deadline: float) -> QueuedEvent:
        while True:
            self.node.advance(integrate=False)
            with event_set.condition:
                if event_set.queue:
                    return event_set.queue.popleft()
                # A set with a lost GPU registered answers GpuIsLost at once, every wait, until
                # it is freed (real drivers do; a loop that only retries spins).
                if any(self.node.gpus[i].lost for i in event_set.masks):
                    raise NvmlFailure(GPU_IS_LOST)
                remaining = deadline - time.monotonic()
                if event_set.freed or self.node.closed.is_set() or remaining <= 0:
                    raise NvmlFailure(TIMEOUT)
                # Asleep until an event is pushed or the timeline's next one is due, as a real
                # driver's wait sleeps in the kernel (a timed poll woke the caller 20 times a
                # second for nothing, taking the GIL from the scrapes each time). Under a test's
                # fake clock the due time is only a bound: the test's calls move time along.
                event_set.condition.wait(min(remaining, self.node.seconds_until_due()))


def _fill_metric(metric: Any, early: GpmSample, late: GpmSample, model: GpuModel) -> None:
    """One metric of nvmlGpmMetricsGet: the mean percentage between the two samples."""
    metric_id = int(metric.metricId)
    metric.nvmlReturn = SUCCESS
    if metric_id in GPM_ACTIVITY:
        name = GPM_ACTIVITY[metric_id]
        metric.value = 100 * (late.integrals[name] - early.integrals[name]) / (late.t - early.t)
    elif metric_id in GPM_PIPE_SHARES:
        share = GPM_PIPE_SHARES[metric_id]
        metric.value = (
            share * 100 * (late.integrals["sm"] - early.integrals["sm"]) / (late.t - early.t)
        )
    elif (engine := _engine_instance(metric_id)) is not None:
        kind, instance = engine
        if instance < model.engines.get(kind, 0):
            metric.value = 0.0  # no simulated workload uses the media engines
        else:
            metric.nvmlReturn = NOT_SUPPORTED  # an engine instance the GPU does not have
    elif metric_id in GPM_ZERO:
        metric.value = 0.0
    elif 0 < metric_id < pynvml.NVML_GPM_METRIC_MAX:
        metric.nvmlReturn = NOT_SUPPORTED
    else:
        metric.nvmlReturn = INVALID_ARGUMENT


def _engine_instance(metric_id: int) -> tuple[str, int] | None:
    """(engine count key, instance) of a media-engine GPM metric; None for other metrics."""
    for first, (kind, count) in GPM_ENGINES.items():
        if first <= metric_id < first + count:
            return kind, metric_id - first
    return None
