"""Every collector, through the real pynvml module, against the simulator's NVML."""

from __future__ import annotations

import pytest

from gpu_exporter.ledger import SM_BANDS, sm_band
from tests.helpers import one, select, simulated_sampler

H100 = "gpus: [{model: H100-SXM-80GB}]"
MiB = 1024**2
GiB = 1024**3


async def test_memory_power_temperature_and_clocks_of_a_busy_gpu() -> None:
    scenario = """
        gpus: [{model: H100-SXM-80GB}]
        workloads: [{gpu: 0, pod: p, memory: 60GiB, sm: 0.9}]
    """
    async with simulated_sampler(scenario) as sim:
        await sim.fast_round()
        series = await sim.fast_round()
    assert one(series, "gpu_memory_total_bytes", gpu="0") == 81559 * MiB  # as an H100 reports
    assert one(series, "gpu_memory_used_bytes", gpu="0") >= 60 * GiB
    used, reserved, total = (
        one(series, f"gpu_memory_{kind}_bytes", gpu="0") for kind in ("used", "reserved", "total")
    )
    gpu = sim.node.gpus[0]
    # Free is not served: NVML's free is exactly what a query derives.
    assert total - used - reserved == gpu.memory_total - gpu.memory_used() - gpu.memory_reserved
    assert select(series, "gpu_memory_free_bytes") == {}
    assert one(series, "gpu_power_limit_watts", gpu="0") == 700
    assert 72 < one(series, "gpu_power_watts", gpu="0") <= 700
    assert one(series, "gpu_energy_joules_total", gpu="0") > 0
    assert 30 < one(series, "gpu_temperature_celsius", gpu="0", sensor="gpu") < 90
    assert one(series, "gpu_temperature_celsius", sensor="memory") > 30
    assert one(series, "gpu_clock_hertz", clock="sm") > 1e9, "clocks are in hertz, not MHz"
    assert one(series, "gpu_clock_hertz", clock="memory") > 1e9


async def test_sm_activity_integral_equals_the_scenario_mean_over_a_window() -> None:
    # Bursty: 0.8 for 30% of each 10 s period, else 0.1 -> mean 0.31.
    scenario = """
        gpus: [{model: H100-SXM-80GB}]
        workloads:
          - {gpu: 0, pod: p, sm: {pattern: bursty, value: 0.8, low: 0.1, period: 10s, duty: 0.3},
             tensor: {pattern: ramp, from: 0.0, to: 0.5, period: 20s}}
    """
    async with simulated_sampler(scenario) as sim:
        await sim.fast_round()
        start = await sim.fast_round()
        for _ in range(60):
            end = await sim.fast_round()
    window = 60.0
    sm_mean = (
        one(end, "gpu_sm_active_seconds_total") - one(start, "gpu_sm_active_seconds_total")
    ) / window
    tensor_mean = (
        one(end, "gpu_tensor_active_seconds_total") - one(start, "gpu_tensor_active_seconds_total")
    ) / window
    assert sm_mean == pytest.approx(0.31, rel=0.02)
    assert tensor_mean == pytest.approx(0.25, rel=0.02)
    assert 0.0 <= one(end, "gpu_sm_active_ratio") <= 1.0


async def test_sm_activity_bands_tell_bursts_from_steady_work_of_the_same_mean() -> None:
    # Both average 45% SM activity: GPU 0 in bursts at 90% with idle gaps (a loader starving
    # it), GPU 1 steadily at 45% (small kernels). The mean cannot tell them apart; the bands do.
    scenario = """
        gpus: [{model: H100-SXM-80GB, count: 2}]
        workloads:
          - {gpu: 0, pod: starved, sm: {pattern: bursty, value: 0.9, period: 20s, duty: 0.5}}
          - {gpu: 1, pod: steady, sm: 0.45}
    """
    async with simulated_sampler(scenario, "--collector.activity.detail") as sim:
        await sim.fast_round()
        start = await sim.fast_round()
        for _ in range(40):
            end = await sim.fast_round()

    def share(gpu: str, band: str) -> float:
        name = "gpu_sm_activity_band_seconds_total"
        spent = one(end, name, gpu=gpu, band=band) - one(start, name, gpu=gpu, band=band)
        return spent / 40.0

    for gpu in ("0", "1"):
        mean = (
            one(end, "gpu_sm_active_seconds_total", gpu=gpu)
            - one(start, "gpu_sm_active_seconds_total", gpu=gpu)
        ) / 40.0
        assert mean == pytest.approx(0.45, rel=0.05), f"gpu {gpu}: the same mean activity"
        total = sum(share(gpu, band) for band in ("low", "mid", "high"))
        assert total == pytest.approx(1.0), f"gpu {gpu}: every second lands in one band"
    # A round that straddles a burst's edge averages into mid: at most one per edge.
    assert share("0", "high") == pytest.approx(0.5, abs=0.06)
    assert share("0", "low") == pytest.approx(0.5, abs=0.06)
    assert share("0", "mid") <= 0.1
    assert share("1", "mid") == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("ratio", "band"),
    [(0.0, "low"), (0.0999, "low"), (0.1, "mid"), (0.5, "mid"), (0.5001, "high"), (1.0, "high")],
)
def test_sm_band_edges_belong_to_the_middle_band(ratio: float, band: str) -> None:
    assert SM_BANDS[sm_band(ratio)] == band


async def test_utilization_reads_kernel_residency_not_sm_activity() -> None:
    scenario = """
        gpus: [{model: H100-SXM-80GB}]
        workloads: [{gpu: 0, pod: p, sm: 0.05}]
    """
    async with simulated_sampler(scenario) as sim:
        await sim.fast_round()
        series = await sim.fast_round()
    assert one(series, "gpu_utilization_ratio") == 1.0
    assert one(series, "gpu_sm_active_ratio") == pytest.approx(0.05)
    assert one(series, "gpu_utilization_seconds_total") == pytest.approx(1.0)


async def test_mig_instances_are_devices_with_their_own_memory_and_activity() -> None:
    scenario = """
        gpus: [{model: H100-SXM-80GB, mig: [3g.40gb, 1g.10gb]}]
        workloads:
          - {gpu: 0, mig: 0, pod: big, memory: 30GiB, sm: 0.7}
          - {gpu: 0, mig: 1, pod: small, memory: 2GiB, sm: 0.2}
    """
    async with simulated_sampler(scenario) as sim:
        await sim.fast_round()
        series = await sim.fast_round()
    infos = select(series, "gpu_mig_info")
    assert len(infos) == 2
    profiles = {dict(labels)["mig_profile"] for labels in infos}
    assert profiles == {"3g.40gb", "1g.10gb"}
    big = one(series, "gpu_sm_active_ratio", mig_profile="3g.40gb")
    assert big == pytest.approx(0.7)
    assert one(series, "gpu_memory_used_bytes", mig_profile="1g.10gb") == 2 * GiB
    labels = dict(next(iter(select(series, "gpu_memory_used_bytes", mig_profile="3g.40gb"))))
    assert labels["uuid"].startswith("MIG-")
    assert labels["gpu"] == "0"
    assert labels["gpu_instance_id"]
    assert labels["compute_instance_id"] == "0"
    assert one(series, "gpu_info", gpu="0", mig_mode="enabled") == 1
    # NVML has no utilisation on MIG-enabled GPUs: the series is omitted, not zero.
    assert select(series, "gpu_utilization_ratio") == {}


async def test_gpus_without_gpm_report_no_activity_source_and_no_sm_series(
    capsys: pytest.CaptureFixture[str],
) -> None:
    scenario = """
        gpus: [{model: A100-SXM-80GB}, {model: L40S}]
        workloads: [{gpu: 0, pod: p, sm: 0.5}]
    """
    async with simulated_sampler(scenario) as sim:
        await sim.fast_round()
        series = await sim.fast_round()
    assert one(series, "gpu_info", gpu="0", activity_source="none") == 1
    assert one(series, "gpu_info", gpu="1", activity_source="none") == 1
    assert select(series, "gpu_sm_active_ratio") == {}
    assert one(series, "gpu_utilization_ratio", gpu="0") == 1.0


async def test_throttling_flags_and_time_come_from_nvml_counters() -> None:
    async with simulated_sampler(H100 + "\nworkloads: [{gpu: 0, pod: p, sm: 0.9}]") as sim:
        await sim.fast_round()
        sim.inject({"type": "throttle", "gpu": 0, "reason": "sw_power_cap"})
        first = await sim.fast_round()
        later = await sim.fast_round(5.0)
    assert one(first, "gpu_clocks_event_active", reason="sw_power_cap") == 1
    assert one(first, "gpu_clocks_event_active", reason="hw_slowdown") == 0
    cap_time = one(later, "gpu_clocks_event_seconds_total", reason="sw_power_cap") - one(
        first, "gpu_clocks_event_seconds_total", reason="sw_power_cap"
    )
    assert cap_time == pytest.approx(5.0)
    assert one(later, "gpu_clocks_event_seconds_total", reason="hw_slowdown") == 0


async def test_throttle_reasons_without_an_nvml_counter_are_integrated_from_samples() -> None:
    async with simulated_sampler(H100 + "\nworkloads: [{gpu: 0, pod: p, sm: 0.9}]") as sim:
        await sim.fast_round()
        sim.inject({"type": "throttle", "gpu": 0, "reason": "hw_slowdown"})
        first = await sim.fast_round()
        later = await sim.fast_round(3.0)
    assert one(later, "gpu_clocks_event_active", reason="hw_slowdown") == 1
    delta = one(later, "gpu_clocks_event_seconds_total", reason="hw_slowdown") - one(
        first, "gpu_clocks_event_seconds_total", reason="hw_slowdown"
    )
    assert delta == pytest.approx(3.0)


async def test_idle_gpu_reports_the_gpu_idle_reason() -> None:
    async with simulated_sampler(H100) as sim:
        series = await sim.fast_round()
    assert one(series, "gpu_clocks_event_active", reason="gpu_idle") == 1


async def test_ecc_and_row_remapping_follow_the_hardware_state() -> None:
    async with simulated_sampler(H100) as sim:
        before = await sim.slow_round()
        sim.inject({"type": "ecc", "gpu": 0, "corrected": 5, "uncorrected": 1})
        sim.inject({"type": "row_remap", "gpu": 0, "cause": "uncorrectable"})
        after = await sim.slow_round()
        sim.inject({"type": "row_remap_failure", "gpu": 0})
        failed = await sim.slow_round()
    ecc = "gpu_ecc_errors_total"
    assert one(before, ecc, type="uncorrected", counter="volatile") == 0
    assert one(after, ecc, type="corrected", counter="volatile") == 5
    assert not select(after, ecc, counter="aggregate"), "lifetime counts only on request"
    assert one(after, "gpu_remapped_rows_total", cause="uncorrectable") == 1
    assert one(before, "gpu_row_remap_pending") == 0
    assert one(after, "gpu_row_remap_pending") == 1
    assert one(after, "gpu_row_remap_failed") == 0
    assert one(failed, "gpu_row_remap_failed") == 1
    banks = select(after, "gpu_row_remap_banks")
    assert {dict(k)["availability"] for k in banks} == {"low", "none"}, "the banks to act on"
    # Retired pages are pre-Ampere: omitted on Hopper.
    assert select(after, "gpu_retired_pages_total") == {}


async def test_lifetime_ecc_counts_and_the_whole_bank_histogram_come_on_request() -> None:
    async with simulated_sampler(
        H100, "--collector.ecc.aggregate", "--collector.remap.banks"
    ) as sim:
        sim.inject({"type": "ecc", "gpu": 0, "corrected": 5, "uncorrected": 1})
        series = await sim.slow_round()
    assert one(series, "gpu_ecc_errors_total", type="uncorrected", counter="aggregate") == 1
    assert one(series, "gpu_ecc_errors_total", type="uncorrected", counter="volatile") == 1
    banks = select(series, "gpu_row_remap_banks")
    assert {dict(k)["availability"] for k in banks} == {"max", "high", "partial", "low", "none"}


async def test_pre_ampere_gpus_report_retired_pages_and_no_row_remapping() -> None:
    async with simulated_sampler("gpus: [{model: V100-SXM2-32GB}]") as sim:
        sim.inject({"type": "retired_pages", "gpu": 0, "cause": "double_bit", "count": 2})
        series = await sim.slow_round()
    assert one(series, "gpu_retired_pages_total", cause="double_bit") == 2
    assert one(series, "gpu_retired_pages_total", cause="multiple_single_bit") == 0
    assert one(series, "gpu_retired_pages_pending") == 1
    assert select(series, "gpu_remapped_rows_total") == {}


async def test_recovery_action_is_one_series_naming_the_current_action() -> None:
    async with simulated_sampler(H100) as sim:
        before = await sim.fast_round()
        sim.inject({"type": "recovery_action", "gpu": 0, "action": "drain_and_reset"})
        series = await sim.fast_round()
    assert {dict(k)["action"]: v for k, v in select(before, "gpu_recovery_action").items()} == {
        "none": 1
    }
    states = {dict(k)["action"]: v for k, v in select(series, "gpu_recovery_action").items()}
    assert states == {"drain_and_reset": 1}, "the actions exclude each other: one series"


async def test_older_drivers_without_the_recovery_field_omit_it() -> None:
    scenario = 'node: {driver_version: "535.104.05"}\n' + H100
    async with simulated_sampler(scenario) as sim:
        series = await sim.fast_round()
    assert select(series, "gpu_recovery_action") == {}
    assert one(series, "gpu_exporter_collector_success", collector="recovery") == 1


async def test_disabled_collectors_emit_nothing() -> None:
    async with simulated_sampler(H100, collectors=frozenset({"memory"})) as sim:
        series = await sim.fast_round()
    assert one(series, "gpu_memory_total_bytes") > 0
    assert select(series, "gpu_power_watts") == {}
    assert set(dict(k)["collector"] for k in select(series, "gpu_exporter_collector_success")) == {
        "memory"
    }
