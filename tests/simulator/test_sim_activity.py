"""Activity is exact: GPM means, energy and clock-event counters reproduce the scenario."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from .sim_helpers import FakeClock, MakeNode

SM_UTIL, SM_OCCUPANCY, TENSOR, DRAM = 2, 3, 5, 10


def gpm_percent(handle: Any, clock: FakeClock, seconds: float, metric: int = SM_UTIL) -> float:
    """What an exporter gets from two GPM samples ``seconds`` apart."""
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    try:
        pynvml.nvmlGpmSampleGet(handle, first)
        clock.advance(seconds)
        pynvml.nvmlGpmSampleGet(handle, second)
        return metric_value(first, second, metric)
    finally:
        pynvml.nvmlGpmSampleFree(first)
        pynvml.nvmlGpmSampleFree(second)


def metric_value(first: Any, second: Any, metric: int) -> float:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = metric
    pynvml.nvmlGpmMetricsGet(request)
    assert request.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS
    return float(request.metrics[0].value)


def gpu0() -> Any:
    return pynvml.nvmlDeviceGetHandleByIndex(0)


def test_bursty_mean_over_whole_periods(make_node: MakeNode, clock: FakeClock) -> None:
    make_node("""
        gpus: [H100-SXM-80GB]
        workloads:
          - {gpu: 0, sm: {pattern: bursty, value: 0.8, period: 10s, duty: 0.3}}
        """)
    assert gpm_percent(gpu0(), clock, 100) == pytest.approx(24.0, rel=1e-3)


def test_exporter_integrating_gpm_reproduces_the_mean(
    make_node: MakeNode, clock: FakeClock
) -> None:
    """Samples at an odd interval, integrated value * dt, give the exact scenario mean."""
    make_node("""
        gpus: [H100-SXM-80GB]
        workloads:
          - {gpu: 0, sm: {pattern: ramp, from: 0.2, to: 0.6, period: 60s}}
        """)
    handle, integral, step = gpu0(), 0.0, 1.3
    samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
    pynvml.nvmlGpmSampleGet(handle, samples[0])
    for i in range(1, 139):  # 138 * 1.3 s = 179.4 s, then 0.6 s more: 3 whole ramps
        clock.advance(step)
        pynvml.nvmlGpmSampleGet(handle, samples[i % 2])
        integral += metric_value(samples[(i - 1) % 2], samples[i % 2], SM_UTIL) * step
    clock.advance(0.6)
    pynvml.nvmlGpmSampleGet(handle, samples[1])
    integral += metric_value(samples[0], samples[1], SM_UTIL) * 0.6
    assert integral / 180 == pytest.approx(40.0, rel=1e-3)


def test_time_sliced_workloads_add_up_and_clamp(make_node: MakeNode, clock: FakeClock) -> None:
    make_node("""
        gpus: [H100-SXM-80GB]
        workloads:
          - {gpu: 0, sm: 0.5}
          - {gpu: 0, sm: {pattern: bursty, value: 0.8, period: 4s, duty: 0.5}}
        """)
    # Half the time 0.5 + 0.8 clamps to 1.0, the other half 0.5: mean 0.75.
    assert gpm_percent(gpu0(), clock, 40) == pytest.approx(75.0, rel=1e-3)


def test_other_metrics_follow_their_own_patterns(make_node: MakeNode, clock: FakeClock) -> None:
    make_node("""
        gpus: [H100-SXM-80GB]
        workloads:
          - {gpu: 0, sm: 0.6, tensor: "30%", dram: 0.2}
        """)
    handle = gpu0()
    assert gpm_percent(handle, clock, 5, TENSOR) == pytest.approx(30.0)
    assert gpm_percent(handle, clock, 5, DRAM) == pytest.approx(20.0)
    # Without an explicit occupancy, half the warps of the busy SMs.
    assert gpm_percent(handle, clock, 5, SM_OCCUPANCY) == pytest.approx(30.0)


def test_utilization_is_kernel_resident_time_not_sm_activity(
    make_node: MakeNode, clock: FakeClock
) -> None:
    make_node("""
        gpus: [H100-SXM-80GB]
        workloads:
          - {gpu: 0, sm: 0.1}
        """)
    clock.advance(5)
    assert pynvml.nvmlDeviceGetUtilizationRates(gpu0()).gpu == 100
    assert gpm_percent(gpu0(), clock, 5) == pytest.approx(10.0)


def test_mig_instances_have_their_own_gpm(make_node: MakeNode, clock: FakeClock) -> None:
    make_node("""
        gpus:
          - {model: H100-SXM-80GB, mig: [4g.40gb, 3g.40gb]}
        workloads:
          - {gpu: 0, mig: 1, sm: 0.7}
        """)
    parent = gpu0()
    gi = pynvml.nvmlDeviceGetGpuInstanceId(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1))
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmMigSampleGet(parent, gi, first)
    clock.advance(10)
    pynvml.nvmlGpmMigSampleGet(parent, gi, second)
    assert metric_value(first, second, SM_UTIL) == pytest.approx(70.0)
    # The whole GPU sees the instance weighted by its 3 of 7 slices.
    assert gpm_percent(parent, clock, 10) == pytest.approx(70.0 * 3 / 7)


def test_energy_is_the_integral_of_power(make_node: MakeNode, clock: FakeClock) -> None:
    make_node("""
        gpus: [H100-SXM-80GB]
        workloads:
          - {gpu: 0, sm: 0.5, dram: 0.5}
        """)
    handle = gpu0()
    power_mw = pynvml.nvmlDeviceGetPowerUsage(handle)
    assert power_mw == pytest.approx(72_000 + 628_000 * 0.5)
    before = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    clock.advance(60)
    after = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    assert after - before == pytest.approx(power_mw * 60, abs=2)


def test_power_capping_slows_clocks_and_counts_time(make_node: MakeNode, clock: FakeClock) -> None:
    make_node("""
        gpus: [H100-SXM-80GB]
        workloads:
          - {gpu: 0, sm: 0.9}
        timeline:
          - {at: 10s, type: throttle, gpu: 0, reason: sw_power_cap, duration: 30s}
        """)
    handle = gpu0()
    full_power = pynvml.nvmlDeviceGetPowerUsage(handle)
    clock.advance(20)
    assert (
        pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        == pynvml.nvmlClocksEventReasonSwPowerCap
    )
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) < 1980
    assert pynvml.nvmlDeviceGetPowerUsage(handle) < full_power
    clock.advance(40)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == 0
    (counter,) = pynvml.nvmlDeviceGetFieldValues(handle, [74])
    assert counter.value.ullVal == 30 * 10**9


def test_idle_gpu_reports_gpu_idle(make_node: MakeNode, clock: FakeClock) -> None:
    make_node("""
        gpus: [H100-SXM-80GB]
        workloads:
          - {gpu: 0, memory: 1GiB, sm: {pattern: bursty, value: 0.5, period: 10s, duty: 0.4}}
        """)
    handle = gpu0()
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == 0
    clock.advance(5)
    idle = pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    assert idle == pynvml.nvmlClocksEventReasonGpuIdle
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) == 345
    clock.advance(95)
    (low_utilization,) = pynvml.nvmlDeviceGetFieldValues(handle, [78])
    assert low_utilization.value.ullVal == pytest.approx(60 * 10**9, rel=1e-9)


def test_gpm_refuses_samples_100_ms_apart_or_closer_and_reversed(
    make_node: MakeNode, clock: FakeClock
) -> None:
    make_node("gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, sm: 0.5}]")
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(gpu0(), first)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        metric_value(first, first, SM_UTIL)  # one sample is no interval
    clock.advance(0.05)
    pynvml.nvmlGpmSampleGet(gpu0(), second)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        metric_value(first, second, SM_UTIL)  # 50 ms: too close for GPM
    clock.advance(1.0)
    pynvml.nvmlGpmSampleGet(gpu0(), second)
    assert metric_value(first, second, SM_UTIL) == pytest.approx(50.0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        metric_value(second, first, SM_UTIL)  # reversed: never sorted behind the caller's back


def test_reads_milliseconds_apart_share_one_integration_and_gpm_stays_exact(
    make_node: MakeNode, clock: FakeClock
) -> None:
    """A read integrates counters only when they are over 10 ms behind (one round's reads come
    ms apart); a GPM sample carries the time its counters reached, so the rate is still exact."""
    node = make_node("""
        gpus: [H100-SXM-80GB]
        workloads:
          - {gpu: 0, sm: {pattern: ramp, from: 0.2, to: 0.6, period: 60s}}
        """)
    handle, gpu = gpu0(), node.gpus[0]
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(handle, first)
    clock.advance(15.0)
    pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # integrates to now
    integrated = node.integrated_at(gpu)
    clock.advance(0.004)
    pynvml.nvmlGpmSampleGet(handle, second)
    assert node.integrated_at(gpu) == integrated, "4 ms later: the same integration serves"
    # The ramp's mean over [0, 15 s] (where the counters are): 0.2 + 0.4 * 7.5 / 60 = 0.25.
    assert metric_value(first, second, SM_UTIL) == pytest.approx(25.0, rel=1e-6)
    clock.advance(0.02)
    pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    assert node.integrated_at(gpu) > integrated, "20 ms behind: integrated again"
