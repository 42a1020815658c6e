"""Fabric, GPM pipes, media engines and device state, through pynvml against the simulator."""

from __future__ import annotations

import pytest

from gpu_exporter.collectors import gpm
from tests.helpers import one, select, simulated_sampler

GB200_RACK_SLICE = """
    node: {fabric_cluster_uuid: 0a1b2c3d-4e5f-4071-8293-a4b5c6d7e8f9, fabric_clique_id: 7}
    gpus: [{model: GB200-NVL72, count: 4}]
"""


async def test_gb200_gpus_report_one_nvlink_domain_and_its_health() -> None:
    async with simulated_sampler(GB200_RACK_SLICE) as sim:
        series = await sim.slow_round()
        sim.inject({"type": "fabric_degraded", "gpu": 2, "health": "limited_capacity"})
        sim.clock.advance(30)
        degraded = await sim.slow_round()
    domains = {
        (dict(k)["cluster_uuid"], dict(k)["clique_id"], dict(k)["state"])
        for k in select(series, "gpu_fabric_info")
    }
    assert domains == {("0a1b2c3d-4e5f-4071-8293-a4b5c6d7e8f9", "7", "completed")}
    assert len(select(series, "gpu_fabric_info")) == 4, "every GPU names its domain"
    assert set(select(series, "gpu_fabric_healthy").values()) == {1.0}
    assert one(degraded, "gpu_fabric_healthy", gpu="2") == 0, "limited capacity is not healthy"
    assert one(degraded, "gpu_fabric_healthy", gpu="1") == 1


async def test_an_hgx_board_reports_a_fabric_without_a_cluster_and_pcie_cards_none() -> None:
    async with simulated_sampler("gpus: [{model: H100-SXM-80GB}, {model: L40S}]") as sim:
        series = await sim.slow_round()
    # A zero cluster UUID: the node is the GPU's domain, and a completed fabric's info would
    # repeat what gpu_fabric_healthy says (docs/migration.md).
    assert not select(series, "gpu_fabric_info", gpu="0"), "nothing to add to healthy"
    assert one(series, "gpu_fabric_healthy", gpu="0") == 1
    assert not select(series, "gpu_fabric_info", gpu="1"), "no fabric: no series, not zero"


@pytest.mark.parametrize("layout", ["unpacked from bytes", "read member by member"])
async def test_every_gpm_pipe_has_an_exact_integral(
    layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pynvml whose GPM metric struct differs from the layout we unpack is read through ctypes.
    if layout == "read member by member":
        monkeypatch.setattr(gpm, "_layout_matches", lambda: False)
    scenario = """
        gpus: [{model: H100-SXM-80GB}]
        workloads: [{gpu: 0, pod: p, sm: 0.8}]
    """
    async with simulated_sampler(scenario, "--collector.pipes.detail") as sim:
        await sim.fast_round()
        start = await sim.fast_round()
        for _ in range(10):
            end = await sim.fast_round()
    pipes = {dict(k)["pipe"] for k in select(end, "gpu_pipe_active_seconds_total")}
    assert pipes == {"fp64", "fp32", "fp16", "integer", "graphics"}
    assert select(end, "gpu_pipe_active_ratio") == {}, "rate() of the integral is the ratio"
    # The simulator's FP32 pipe is 40% of SM activity: 0.32 while the SMs are 80% busy.
    fp32 = one(end, "gpu_pipe_active_seconds_total", pipe="fp32") - one(
        start, "gpu_pipe_active_seconds_total", pipe="fp32"
    )
    assert fp32 == pytest.approx(0.32 * 10)


async def test_media_engines_come_from_gpm_on_hopper_and_from_nvml_elsewhere() -> None:
    async with simulated_sampler("gpus: [{model: H100-SXM-80GB}, {model: L40S}]") as sim:
        await sim.slow_round()
        await sim.fast_round()
        series = await sim.fast_round()
        calls_before = sim.node.calls["nvmlDeviceGetDecoderUtilization"]
        await sim.fast_round()
        fast_calls = sim.node.calls["nvmlDeviceGetDecoderUtilization"] - calls_before
    engines = "gpu_engine_utilization_seconds_total"
    hopper = {dict(k)["engine"] for k in select(series, engines, gpu="0")}
    assert hopper == {"decoder"}, "an H100 has no NVENC; JPEG and OFA only with detail"
    ada = {dict(k)["engine"] for k in select(series, engines, gpu="1")}
    assert ada == {"encoder", "decoder"}
    assert fast_calls == 0, "engines without GPM are read on the slow cadence only"


async def test_the_fp_and_integer_pipes_and_the_jpeg_and_ofa_engines_come_with_detail() -> None:
    scenario = """
        gpus: [{model: H100-SXM-80GB}, {model: L40S}]
        workloads: [{gpu: 0, pod: p, sm: 0.8}]
    """
    async with simulated_sampler(scenario) as sim:
        await sim.fast_round()
        defaults = await sim.fast_round()
    pipes = {dict(k)["pipe"] for k in select(defaults, "gpu_pipe_active_seconds_total")}
    assert pipes == {"graphics"}, "at defaults the graphics pipe only (dcgm-exporter's GR engine)"
    async with simulated_sampler(scenario, "--collector.pipes.detail") as sim:
        await sim.slow_round()
        await sim.fast_round()
        series = await sim.fast_round()
    pipes = {dict(k)["pipe"] for k in select(series, "gpu_pipe_active_seconds_total")}
    assert pipes == {"fp64", "fp32", "fp16", "integer", "graphics"}
    engines = "gpu_engine_utilization_seconds_total"
    assert {dict(k)["engine"] for k in select(series, engines, gpu="0")} == {
        "decoder",
        "jpeg",
        "ofa",
    }
    assert {dict(k)["engine"] for k in select(series, engines, gpu="1")} == {
        "encoder",
        "decoder",
        "jpeg",
        "ofa",
    }


async def test_gpu_info_carries_modes_serial_and_vbios_and_thresholds_are_served() -> None:
    async with simulated_sampler("gpus: [{model: H100-SXM-80GB}, {model: L40S}]") as sim:
        series = await sim.slow_round()
        sim.clock.advance(30)
        before = sim.node.calls["nvmlDeviceGetTemperatureThreshold"]
        again = await sim.slow_round()
        asked_again = sim.node.calls["nvmlDeviceGetTemperatureThreshold"] - before
    (labels,) = select(series, "gpu_info", gpu="0")
    info = dict(labels)
    assert info["persistence_mode"] == "enabled"
    assert info["compute_mode"] == "default"
    assert info["serial"].isdigit()
    assert info["vbios_version"] == "96.00.99.00.01"
    thresholds = {
        dict(k)["threshold"]: v
        for k, v in select(again, "gpu_temperature_threshold_celsius", gpu="0").items()
    }
    assert thresholds == {"slowdown": 89, "shutdown": 92, "gpu_max": 87, "memory_max": 95}
    assert "memory_max" not in {
        dict(k)["threshold"] for k in select(again, "gpu_temperature_threshold_celsius", gpu="1")
    }, "GDDR parts have no memory threshold"
    assert asked_again == 0, "thresholds are read once"


async def test_a_compute_mode_change_relabels_gpu_info_and_keeps_the_integrals() -> None:
    scenario = """
        gpus: [{model: H100-SXM-80GB}]
        workloads: [{gpu: 0, pod: p, sm: 0.5}]
    """
    async with simulated_sampler(scenario) as sim:
        await sim.slow_round()
        await sim.fast_round()
        before = await sim.fast_round()
        sim.node.gpus[0].compute_mode = 3  # an admin: nvidia-smi -c EXCLUSIVE_PROCESS
        sim.clock.advance(30)
        await sim.slow_round()
        after = await sim.fast_round()
    (labels,) = select(after, "gpu_info")
    assert dict(labels)["compute_mode"] == "exclusive_process"
    assert one(after, "gpu_sm_active_seconds_total") > one(before, "gpu_sm_active_seconds_total"), (
        "a mode change must not rebuild the collectors (their counters would restart at 0)"
    )
