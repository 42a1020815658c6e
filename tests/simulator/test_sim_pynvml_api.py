"""Every pynvml wrapper the exporter uses, called through the real pynvml against the simulator."""

from __future__ import annotations

import ctypes
import pathlib
import threading

import pynvml
import pytest

from .sim_helpers import FakeClock, MakeNode

NODE = """
node: {name: api-node, driver_version: "580.95.05", cuda_version: "13.0"}
gpus:
  - model: H100-SXM-80GB
  - model: H100-SXM-80GB
    mig: [3g.40gb, 1g.10gb]
  - model: V100-SXM2-32GB
workloads:
  - {gpu: 0, pod: train, namespace: ml, pid: 1234, memory: 10GiB, sm: 0.5, tensor: 0.25, dram: 0.4}
  - {gpu: 1, mig: 0, pod: small, namespace: ml, pid: 2345, memory: 8GiB, sm: 0.8}
timeline:
  - {at: 1h, type: retired_pages, gpu: 2, cause: double_bit, count: 2}
"""


def test_library_lifetime_and_system_information(make_node: MakeNode) -> None:
    make_node(NODE, init=False)
    pynvml.nvmlInitWithFlags(0)
    pynvml.nvmlInit()
    assert pynvml.nvmlSystemGetDriverVersion() == "580.95.05"
    assert pynvml.nvmlSystemGetNVMLVersion() == "13.580.95.05"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 13000
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 13000
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    pynvml.nvmlShutdown()
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_identity(make_node: MakeNode) -> None:
    make_node(NODE)
    assert pynvml.nvmlDeviceGetCount() == 3
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    assert uuid.startswith("GPU-")
    same = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    assert pynvml.nvmlDeviceGetIndex(same) == 0
    assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    assert len(pynvml.nvmlDeviceGetSerial(handle)) == 13
    pci = pynvml.nvmlDeviceGetPciInfo(handle)
    assert (pci.busId, pci.busIdLegacy) == ("00000000:18:00.0", "0000:18:00.0")
    assert pynvml.nvmlDeviceGetArchitecture(handle) == pynvml.NVML_DEVICE_ARCH_HOPPER
    v100 = pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlDeviceGetName(v100) == "Tesla V100-SXM2-32GB"
    assert pynvml.nvmlDeviceGetArchitecture(v100) == pynvml.NVML_DEVICE_ARCH_VOLTA
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")


def test_mig_topology(make_node: MakeNode) -> None:
    make_node(NODE)
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetMigMode(parent) == [1, 1]
    assert pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0)) == [0, 0]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(parent).value == 0
    back = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert pynvml.nvmlDeviceGetUUID(back) == pynvml.nvmlDeviceGetUUID(parent)
    assert pynvml.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    gi_id = pynvml.nvmlDeviceGetGpuInstanceId(mig)
    assert pynvml.nvmlDeviceGetComputeInstanceId(mig) == 0
    instance = pynvml.nvmlDeviceGetGpuInstanceById(parent, gi_id)
    info = pynvml.nvmlGpuInstanceGetInfo(instance)
    assert info.id == gi_id
    assert pynvml.nvmlDeviceGetUUID(info.device) == pynvml.nvmlDeviceGetUUID(parent)
    profile = pynvml.nvmlDeviceGetGpuInstanceProfileInfoById(parent, info.profileId)
    assert (profile.name, profile.sliceCount) == ("MIG 3g.40gb", 3)
    assert pynvml.nvmlDeviceGetMemoryInfo(mig).total == profile.memorySizeMB * 2**20
    assert pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(mig)) is not None


def test_a_non_root_caller_sees_mig_instances_but_not_their_gpu_instances(
    make_node: MakeNode,
) -> None:
    make_node(NODE.replace('cuda_version: "13.0"}', 'cuda_version: "13.0", privileged: false}'))
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetGpuInstanceById(parent, pynvml.nvmlDeviceGetGpuInstanceId(mig))
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetMemoryInfo(parent)  # the aggregate of the instances
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetComputeRunningProcesses(parent)
    assert pynvml.nvmlDeviceGetMemoryInfo(mig).total == 40192 * 2**20
    (process,) = pynvml.nvmlDeviceGetComputeRunningProcesses(mig)
    assert process.pid == 2345
    attributes = pynvml.nvmlDeviceGetAttributes(mig)
    assert (attributes.gpuInstanceSliceCount, attributes.memorySizeMB) == (3, 40192)
    profile = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, 2)
    assert (profile.name, profile.sliceCount, profile.memorySizeMB) == ("MIG 3g.40gb", 3, 40192)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, 5)  # an 8-slice profile: not on H100
    # A whole GPU without MIG is not an aggregate: it answers as to root.
    assert pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total > 0


def test_memory_v1_and_v2(make_node: MakeNode) -> None:
    make_node(NODE)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert v2.total == 81559 * 2**20
    assert v2.used >= 10 * 2**30
    assert v2.total == v2.reserved + v2.used + v2.free
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    assert v1.total == v1.used + v1.free
    assert v1.used == v2.used + v2.reserved


def test_activity_power_thermal_and_clocks(make_node: MakeNode, clock: FakeClock) -> None:
    make_node(NODE)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock.advance(10)
    assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == 100
    assert pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 1
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(handle, first)
    clock.advance(2)
    pynvml.nvmlGpmSampleGet(handle, second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 4
    request.sample1, request.sample2 = first, second
    for i, metric in enumerate((2, 3, 5, 10)):
        request.metrics[i].metricId = metric
    pynvml.nvmlGpmMetricsGet(request)
    values = [request.metrics[i].value for i in range(4)]
    assert [request.metrics[i].nvmlReturn for i in range(4)] == [0, 0, 0, 0]
    assert values == pytest.approx([50.0, 25.0, 25.0, 40.0])
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    pynvml.nvmlGpmMigSampleGet(parent, 1, first)
    pynvml.nvmlGpmSampleFree(first)
    pynvml.nvmlGpmSampleFree(second)
    assert 72_000 < pynvml.nvmlDeviceGetPowerUsage(handle) < 700_000
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 700_000
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle) == 700_000
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) > 0
    assert 30 < pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) < 90
    assert pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU) > 30
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) == 1980
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_GRAPHICS) == 1980
    assert pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM) == 2619
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == 0
    assert pynvml.nvmlDeviceGetSupportedClocksEventReasons(handle) & 0xFF == 0xFF


def test_field_values(make_node: MakeNode) -> None:
    make_node(NODE)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    values = pynvml.nvmlDeviceGetFieldValues(handle, [74, 82, 230, 999])
    # 999 is beyond NVML_FI_MAX of the driver's header: unknown to the driver.
    assert [v.nvmlReturn for v in values] == [0, 0, 0, pynvml.NVML_ERROR_INVALID_ARGUMENT]
    assert values[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert values[1].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert values[2].value.uiVal == pynvml.NVML_GPU_RECOVERY_ACTION_NONE


def test_memory_errors(make_node: MakeNode, clock: FakeClock) -> None:
    make_node(NODE)
    h100 = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetEccMode(h100) == [1, 1]
    for error_type in (0, 1):
        for counter in (0, 1):
            assert pynvml.nvmlDeviceGetTotalEccErrors(h100, error_type, counter) == 0
    assert pynvml.nvmlDeviceGetRemappedRows(h100) == (0, 0, 0, 0)
    histogram = pynvml.nvmlDeviceGetRowRemapperHistogram(h100)
    assert (histogram.max, histogram.none) == (2560, 0)
    v100 = pynvml.nvmlDeviceGetHandleByIndex(2)
    clock.advance(3600)
    assert len(pynvml.nvmlDeviceGetRetiredPages(v100, 1)) == 2
    assert pynvml.nvmlDeviceGetRetiredPages(v100, 0) == []
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(v100) == 1


def test_running_processes(make_node: MakeNode) -> None:
    make_node(NODE)
    (process,) = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert (process.pid, process.usedGpuMemory) == (1234, 10 * 2**30)
    assert (process.gpuInstanceId, process.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    (in_mig,) = pynvml.nvmlDeviceGetComputeRunningProcesses(parent)
    assert (in_mig.pid, in_mig.gpuInstanceId, in_mig.computeInstanceId) == (2345, 1, 0)
    empty_mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(empty_mig) == []


def test_nvml_events(make_node: MakeNode) -> None:
    node = make_node(NODE)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    event_set = pynvml.nvmlEventSetCreate()
    supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
    assert supported & pynvml.nvmlEventTypeXidCriticalError
    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 1)
    threading.Thread(target=node.inject, args=({"type": "xid", "gpu": 0, "code": 31},)).start()
    data = pynvml.nvmlEventSetWait_v2(event_set, 5000)
    assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 31)
    assert pynvml.nvmlDeviceGetUUID(data.device) == pynvml.nvmlDeviceGetUUID(handle)
    pynvml.nvmlEventSetFree(event_set)


def test_functions_no_driver_exports_are_function_not_found(make_node: MakeNode) -> None:
    make_node(NODE)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSomethingNoDriverHas")
    # A function real drivers export that the simulator does not model answers NotSupported.
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetBoardPartNumber(pynvml.nvmlDeviceGetHandleByIndex(0))


EXPORTER_WRAPPERS = tuple(
    [
        "nvmlInit",
        "nvmlInitWithFlags",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetArchitecture",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetGpuInstanceById",
        "nvmlGpuInstanceGetInfo",
        "nvmlDeviceGetGpuInstanceProfileInfoById",
        "nvmlDeviceGetGpuInstanceProfileInfo",
        "nvmlDeviceGetAttributes",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleFree",
        "nvmlGpmSampleGet",
        "nvmlGpmMigSampleGet",
        "nvmlGpmMetricsGet",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetSupportedClocksEventReasons",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRowRemapperHistogram",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlEventSetCreate",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait_v2",
        "nvmlEventSetFree",
    ]
)


def test_this_file_calls_every_wrapper_the_exporter_uses() -> None:
    source = pathlib.Path(__file__).read_text(encoding="utf-8").split("EXPORTER_WRAPPERS =")[0]
    missing = [name for name in EXPORTER_WRAPPERS if f"pynvml.{name}(" not in source]
    assert missing == []


def test_the_simulators_raw_gpm_metric_has_pynvmls_layout() -> None:
    # The fake nvmlGpmMetricsGet writes the answers through a plain ctypes copy of the struct.
    from gpu_exporter.simulator.nvml_gpm_events import RawGpmMetric

    theirs = pynvml.c_nvmlGpmMetric_t
    assert ctypes.sizeof(RawGpmMetric) == ctypes.sizeof(theirs), "array strides differ"
    for name in ("metricId", "nvmlReturn", "value", "metricInfo"):
        ours, real = getattr(RawGpmMetric, name), getattr(theirs, name)
        assert (ours.offset, ours.size) == (real.offset, real.size), f"{name} is placed elsewhere"
