"""The exporter's branches for what real drivers do and the simulator once did not (issue 21)."""

from __future__ import annotations

import pytest

from tests.helpers import one, select, simulated_sampler

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
    assert one(series, "gpu_memory_used_bytes") + one(series, "gpu_memory_free_bytes") == total
    assert select(series, "gpu_memory_reserved_bytes") == {}, "v1 has no reserved"
    out = capsys.readouterr().out
    assert "struct version 0x02000028" in out
    assert "answers FunctionNotFound also for a struct version it does not take" in out
