"""The exporter's branches for what real drivers do and the simulator once did not (issue 21)."""

from __future__ import annotations

import pytest

from tests.helpers import one, select, simulated_sampler

GB200_NODE = "gpus: [{model: GB200-NVL72}]"
H100 = "gpus: [{model: H100-SXM-80GB}]\nworkloads: [{gpu: 0, pod: p, memory: 1GiB, sm: 0.5}]"


async def test_gpm_rounds_closer_than_100_ms_keep_the_last_reading_without_an_error() -> None:
    async with simulated_sampler(H100) as sim:
        await sim.fast_round()
        before = await sim.fast_round()
        asked = sim.node.calls["nvmlGpmMetricsGet"]
        close = await sim.fast_round(0.05)
        assert sim.node.calls["nvmlGpmMetricsGet"] == asked, "GPM would refuse samples 50 ms apart"
        later = await sim.fast_round()
    assert one(close, "gpu_sm_active_ratio") == pytest.approx(0.5)
    assert one(close, "gpu_sm_active_seconds_total") == one(before, "gpu_sm_active_seconds_total")
    assert one(later, "gpu_sm_active_seconds_total") == pytest.approx(
        one(before, "gpu_sm_active_seconds_total") + 0.5 * 1.05
    ), "the next reading covers the skipped 50 ms too"
    assert select(later, "gpu_exporter_nvml_errors_total") == {}


async def test_memory_v2_refused_falls_back_to_v1_and_the_log_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with simulated_sampler(H100) as sim:
        sim.inject(
            {
                "type": "nvml_error",
                "function": "nvmlDeviceGetMemoryInfo_v2",
                "error": "function_not_found",
            }
        )
        for _ in range(3):
            series = await sim.fast_round()
        assert sim.node.calls["nvmlDeviceGetMemoryInfo_v2"] == 1, "remembered after one answer"
    total = one(series, "gpu_memory_total_bytes")
    # v1 counts reserved as used: what a query derives as free is total - used.
    free = (
        sim.node.gpus[0].memory_total
        - sim.node.gpus[0].memory_used()
        - sim.node.gpus[0].memory_reserved
    )
    assert total - one(series, "gpu_memory_used_bytes") == free
    assert select(series, "gpu_memory_reserved_bytes") == {}, "v1 has no reserved"
    out = capsys.readouterr().out
    assert "struct version 0x02000028" in out
    assert "answers FunctionNotFound also for a struct version it does not take" in out


async def test_a_struct_version_the_driver_refuses_is_remembered_and_the_older_call_used(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ArgumentVersionMismatch: the driver knows the function but not the struct version the
    binding sends. That holds until the driver changes, so it is asked once, like NotSupported,
    and the fabric is read through the unversioned call instead of failing every round."""
    async with simulated_sampler(GB200_NODE) as sim:
        sim.inject(
            {
                "type": "nvml_error",
                "function": "nvmlDeviceGetGpuFabricInfoV",
                "error": "argument_version_mismatch",
            }
        )
        for _ in range(3):
            sim.clock.advance(30)
            series = await sim.slow_round()
        assert sim.node.calls["nvmlDeviceGetGpuFabricInfoV"] == 1, "remembered after one answer"
    assert one(series, "gpu_fabric_healthy") == 1, "the v1 struct still reads the fabric"
    assert len(select(series, "gpu_fabric_info")) == 1
    assert select(series, "gpu_exporter_nvml_errors_total") == {}, "not an error of the device"
    out = capsys.readouterr().out
    assert "does not take the struct version" in out, "the one log line does not say why"


MIG_NODE = """
    node: {privileged: PRIVILEGED}
    gpus:
      - {model: H100-SXM-80GB, mig: [3g.40gb, 1g.10gb, 1g.20gb, 2g.20gb]}
      - {model: H100-SXM-80GB, mig: [7g.80gb]}
    workloads: [{gpu: 0, mig: 0, pod: p, memory: 2GiB, sm: 0.5}]
"""


@pytest.mark.parametrize("privileged", ["true", "false"])
async def test_mig_instances_carry_nvidias_profile_names_with_or_without_root(
    privileged: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with simulated_sampler(MIG_NODE.replace("PRIVILEGED", privileged)) as sim:
        series = await sim.slow_round()
        asked = sim.node.calls["nvmlDeviceGetGpuInstanceById"]
        series = await sim.slow_round()
        again = sim.node.calls["nvmlDeviceGetGpuInstanceById"] - asked
    profiles = sorted(dict(k)["mig_profile"] for k in select(series, "gpu_mig_info"))
    # 7g.80gb has 80384 MiB (78.5 GiB): a name derived from the size would say 7g.79gb.
    assert profiles == ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb"]
    assert select(series, "gpu_exporter_nvml_errors_total") == {}
    if privileged == "false":
        assert again == 0, "NoPermission is remembered per device, not asked every round"
    assert "gpu_instance_profile" not in capsys.readouterr().out, "profiles it lacks: no log"


async def test_without_root_a_mig_parent_loses_its_aggregate_memory_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with simulated_sampler(MIG_NODE.replace("PRIVILEGED", "false")) as sim:
        await sim.fast_round()
        series = await sim.fast_round()
    # Whole GPUs in MIG mode: no aggregate memory; every instance keeps its own.
    memory = select(series, "gpu_memory_total_bytes")
    assert all("mig_profile" in dict(labels) for labels in memory), sorted(memory)
    assert len(memory) == 5
    assert one(series, "gpu_memory_used_bytes", mig_profile="3g.40gb") == 2 * 1024**3
    assert one(series, "gpu_exporter_collector_success", collector="memory") == 1
    logged = [line for line in capsys.readouterr().out.splitlines() if "no_permission" in line]
    assert logged, "the omission is logged"
    assert all("privileges the exporter lacks" in line for line in logged)


async def test_a_mig_capable_gpu_with_mig_off_has_no_mig_slots_and_no_mig_devices() -> None:
    scenario = "gpus: [{model: A100-SXM-80GB}, {model: A100-SXM-80GB, mig: [3g.40gb]}]"
    async with simulated_sampler(scenario) as sim:
        series = await sim.slow_round()
    assert one(series, "gpu_info", gpu="0", mig_mode="disabled") == 1
    assert [dict(k)["gpu"] for k in select(series, "gpu_mig_info")] == ["1"]
    assert select(series, "gpu_exporter_nvml_errors_total") == {}


async def test_after_a_mig_reconfiguration_reused_handles_are_new_instances() -> None:
    scenario = """
        gpus: [{model: H100-SXM-80GB, mig: [3g.40gb, 1g.10gb]}]
        workloads: [{gpu: 0, mig: 0, pod: p, memory: 8GiB}]
    """
    async with simulated_sampler(scenario) as sim:
        before = await sim.slow_round()
        sim.inject({"type": "mig_reconfigure", "gpu": 0, "mig": ["1g.10gb", "4g.40gb"]})
        await sim.slow_round()  # rediscovery sees the new layout
        await sim.fast_round()
        after = await sim.slow_round()
    old = {dict(k)["uuid"] for k in select(before, "gpu_mig_info")}
    new = {dict(k)["mig_profile"]: dict(k)["uuid"] for k in select(after, "gpu_mig_info")}
    assert set(new) == {"1g.10gb", "4g.40gb"}
    assert not old & set(new.values()), "new instances, new UUIDs, though slot handles are reused"
    # Slot 0's handle named the 3g.40gb instance; now the 1g.10gb one, and so do its series.
    assert one(after, "gpu_memory_total_bytes", uuid=new["1g.10gb"]) == 9856 * 1024**2
    assert one(after, "gpu_memory_used_bytes", uuid=new["1g.10gb"]) == 0, "its workload ended"
    assert select(after, "gpu_memory_total_bytes", mig_profile="3g.40gb") == {}


async def test_signals_mig_mode_withheld_come_back_when_the_instances_go() -> None:
    # Remapped rows answer NotSupported while MIG instances exist (reference/nvml.md).
    scenario = "gpus: [{model: H100-SXM-80GB, mig: [3g.40gb]}]"
    async with simulated_sampler(scenario) as sim:
        with_instances = await sim.slow_round()
        sim.inject({"type": "mig_reconfigure", "gpu": 0, "mig": []})
        await sim.slow_round()
        without = await sim.slow_round()
    assert select(with_instances, "gpu_remapped_rows_total") == {}
    assert one(without, "gpu_remapped_rows_total", cause="uncorrectable") == 0
    assert select(without, "gpu_mig_info") == {}
