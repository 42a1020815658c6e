"""Processes as third-party tools see them: listings, MPS, per-process utilisation samples."""

from __future__ import annotations

import pynvml
import pytest

from gpu_exporter.simulator.nvml_processes import PROCESS_SAMPLE_BUFFER_S

from .sim_helpers import FakeClock, MakeNode

SHARED = """
gpus:
  - {model: H100-SXM-80GB, count: 2}
  - {model: H100-SXM-80GB, compute_mode: exclusive_process}
  - {model: H100-SXM-80GB, mig: [3g.40gb]}
workloads:
  # GPU 0, time-sliced: a busy pod and an idle one.
  - {gpu: 0, pod: busy, pid: 100, memory: 10GiB, sm: 0.8, dram: 0.5}
  - {gpu: 0, pod: idle, pid: 101, memory: 5GiB, sm: idle}
  # GPU 1, time-sliced and oversubscribed: each alone would keep it 100% busy.
  - {gpu: 1, pod: a, pid: 200, sm: 0.9, dram: 0.7}
  - {gpu: 1, pod: b, pid: 201, sm: {pattern: bursty, value: 0.5, period: 10s, duty: 0.5}, dram: 0.6}
  # GPU 2, MPS: two clients behind one control server.
  - {gpu: 2, pod: m1, pid: 300, memory: 2GiB, sm: 0.3, mps: true}
  - {gpu: 2, pod: m2, pid: 301, memory: 3GiB, sm: 0.4, mps: true}
  - {gpu: 3, mig: 0, pod: small, pid: 400, sm: 0.5}
"""


def samples(handle: object, since: int = 0) -> list[pynvml.c_nvmlProcessUtilizationSample_t]:
    return list(pynvml.nvmlDeviceGetProcessUtilization(handle, since))


def test_each_process_gets_one_sample_per_second_with_its_own_share(
    make_node: MakeNode, clock: FakeClock
) -> None:
    make_node(SHARED)
    clock.advance(10)
    gpu0 = pynvml.nvmlDeviceGetHandleByIndex(0)
    rows = samples(gpu0)
    by_pid: dict[int, list[int]] = {}
    for row in rows:
        by_pid.setdefault(row.pid, []).append(row.smUtil)
    assert by_pid == {100: [100] * 10, 101: [0] * 10}, "busy pod 100% resident, idle pod 0%"
    assert {row.memUtil for row in rows if row.pid == 100} == {50}


def test_shares_on_a_time_sliced_device_sum_to_at_most_the_device(
    make_node: MakeNode, clock: FakeClock
) -> None:
    make_node(SHARED)
    clock.advance(20)
    rows = samples(pynvml.nvmlDeviceGetHandleByIndex(1))
    per_stamp: dict[int, int] = {}
    for row in rows:
        per_stamp[row.timeStamp] = per_stamp.get(row.timeStamp, 0) + row.smUtil
    assert len(per_stamp) == 20
    assert max(per_stamp.values()) <= 100, per_stamp
    assert min(per_stamp.values()) >= 99, "both kernels resident all the time: the device is full"


def test_samples_since_a_timestamp_are_new_ones_only(make_node: MakeNode, clock: FakeClock) -> None:
    make_node(SHARED)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock.advance(3.5)
    first = samples(handle)
    last_seen = max(row.timeStamp for row in first)
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing new yet: what real drivers answer
        samples(handle, last_seen)
    clock.advance(2)
    second = samples(handle, last_seen)
    assert {row.timeStamp for row in second} == {last_seen + 1_000_000, last_seen + 2_000_000}
    assert not {(r.pid, r.timeStamp) for r in first} & {(r.pid, r.timeStamp) for r in second}


def test_the_driver_holds_a_bounded_history(make_node: MakeNode, clock: FakeClock) -> None:
    make_node(SHARED)
    clock.advance(PROCESS_SAMPLE_BUFFER_S * 3)
    stamps = {row.timeStamp for row in samples(pynvml.nvmlDeviceGetHandleByIndex(0))}
    assert len(stamps) == PROCESS_SAMPLE_BUFFER_S


def test_processes_utilization_info_matches_the_older_call(
    make_node: MakeNode, clock: FakeClock
) -> None:
    make_node(SHARED)
    clock.advance(4)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    new = pynvml.nvmlDeviceGetProcessesUtilizationInfo(handle, 0)
    old = samples(handle)
    assert [(r.pid, r.timeStamp, r.smUtil, r.memUtil) for r in new] == [
        (r.pid, r.timeStamp, r.smUtil, r.memUtil) for r in old
    ]


def test_per_process_utilization_is_not_supported_with_mig(make_node: MakeNode) -> None:
    make_node(SHARED)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        samples(pynvml.nvmlDeviceGetHandleByIndex(3))


def test_mps_lists_the_server_as_compute_process_and_clients_separately(
    make_node: MakeNode,
) -> None:
    make_node(SHARED)
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    compute = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    clients = pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle)
    assert sorted(p.pid for p in clients) == [300, 301]
    assert len(compute) == 1
    assert compute[0].pid not in (300, 301)
    assert pynvml.nvmlSystemGetProcessName(compute[0].pid) == "nvidia-cuda-mps-server"
    assert pynvml.nvmlDeviceGetComputeMode(handle) == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used
    assert memory == 4 * 2**20 + 5 * 2**30 + compute[0].usedGpuMemory
    assert (
        pynvml.nvmlDeviceGetMPSComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0)) == []
    )


def test_what_nvitop_asks_answers_as_on_an_h100(make_node: MakeNode) -> None:
    make_node(SHARED)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # H100 has NVDECs but no NVENC
        pynvml.nvmlDeviceGetEncoderUtilization(handle)
    assert pynvml.nvmlDeviceGetDecoderUtilization(handle) == [0, 167_000]
    assert pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES) > 0
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle) == []
    assert pynvml.nvmlDeviceGetCudaComputeCapability(handle) == (9, 0)
    assert pynvml.nvmlDeviceGetPersistenceMode(handle) == pynvml.NVML_FEATURE_ENABLED
    sizes = pynvml.nvmlDeviceGetConfComputeMemSizeInfo(handle)
    assert sizes.protectedMemSizeKib == 0
    assert sizes.unprotectedMemSizeKib == 81559 * 1024
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(handle)
    bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
    same = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
    assert pynvml.nvmlDeviceGetIndex(same) == 0
