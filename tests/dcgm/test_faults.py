"""DCGM faults: the engine absent at start, restarted, profiling held by another tool, a hung call.
Each keeps everything else served and never puts a DCGM sentinel on /metrics."""

from __future__ import annotations

import asyncio
from textwrap import dedent

import pytest

from tests.helpers import one, select

from .helpers import A100_L40S, dcgm_rig
from .test_source import assert_no_sentinel, started


async def test_an_engine_restart_drops_source_up_then_reconnects_without_an_exporter_restart() -> (
    None
):
    async with dcgm_rig(A100_L40S) as rig:
        before = await started(rig)
        fields_before = set(rig.sim.node.dcgm.field_groups)
        rig.inject({"type": "dcgm_restart", "downtime": "3s"})
        down = await rig.step()
        assert one(down, "gpu_exporter_source_up", source="dcgm") == 0
        assert (
            one(
                down,
                "gpu_exporter_dcgm_errors_total",
                function="dcgmEntitiesGetLatestValues",
                error="connection_not_valid",
            )
            == 1
        )
        assert one(down, "gpu_power_watts", gpu="0") > 0, "NVML series go on"
        seen = [down]
        for _ in range(8):
            seen.append(await rig.step())
        for series in seen:
            assert_no_sentinel(series)
        back = seen[-1]
        engine = rig.sim.node.dcgm
    assert one(back, "gpu_exporter_source_up", source="dcgm") == 1
    assert set(engine.field_groups).isdisjoint(fields_before), "groups and watches re-created"
    assert engine.watches, "watching again"
    total = "gpu_sm_active_seconds_total"
    assert one(back, total, gpu="0") > one(before, total, gpu="0")
    assert one(back, "gpu_info", gpu="0", activity_source="dcgm") == 1


async def test_an_engine_absent_at_start_is_retried_with_backoff_while_the_rest_is_served() -> None:
    scenario = dedent(A100_L40S) + "\ntimeline: [{at: 0s, type: dcgm_restart, downtime: 20s}]"
    async with dcgm_rig(scenario) as rig:
        for _ in range(19):
            series = await rig.step()
        attempts = rig.sim.node.calls["dcgmConnect_v2"]
        assert one(series, "gpu_exporter_source_up", source="dcgm") == 0
        assert one(series, "gpu_info", gpu="0", activity_source="none") == 1
        assert select(series, "gpu_sm_active_ratio") == {}
        assert one(series, "gpu_utilization_ratio", gpu="1") == 1.0
        assert 3 <= attempts <= 6, f"{attempts} connection attempts in 19 s: 1, 2, 4, 8 s apart"
        for _ in range(20):
            series = await rig.step()
    assert one(series, "gpu_exporter_source_up", source="dcgm") == 1
    assert one(series, "gpu_sm_active_ratio", gpu="1") == pytest.approx(0.02)


async def test_profiling_held_by_another_tool_omits_that_gpu_and_says_why() -> None:
    scenario = (
        dedent(A100_L40S) + "\ntimeline: [{at: 0s, type: dcgm_profiling, gpu: 1, state: in_use}]"
    )
    async with dcgm_rig(scenario) as rig:
        series = await started(rig)
    assert one(series, "gpu_exporter_source_up", source="dcgm") == 1
    assert one(series, "gpu_exporter_dcgm_unwatched_devices", reason="in_use") == 1
    assert one(series, "gpu_info", gpu="1", activity_source="none") == 1
    assert select(series, "gpu_sm_active_ratio", gpu="1") == {}
    assert one(series, "gpu_info", gpu="0", activity_source="dcgm") == 1


async def test_counters_taken_while_watched_read_blank_and_are_omitted() -> None:
    async with dcgm_rig(A100_L40S) as rig:
        await started(rig)
        rig.inject({"type": "dcgm_profiling", "gpu": 0, "state": "in_use"})
        series = await rig.step()
        assert_no_sentinel(series)
        assert select(series, "gpu_sm_active_ratio", gpu="0") == {}
        assert one(series, "gpu_sm_active_ratio", gpu="1") == pytest.approx(0.02)
        rig.inject({"type": "dcgm_profiling", "gpu": 0, "state": "free"})
        series = await rig.step()
    assert one(series, "gpu_sm_active_ratio", gpu="0") >= 0


async def test_a_hung_dcgm_call_is_bounded_and_the_session_replaced_when_it_returns() -> None:
    async with dcgm_rig(A100_L40S, call_timeout=0.2) as rig:
        await started(rig)
        rig.inject({"type": "hang", "function": "dcgmEntitiesGetLatestValues"})
        loop = asyncio.get_running_loop()
        before = loop.time()
        hung = await rig.step()
        assert loop.time() - before < 2.0, "the poll gave up on the call"
        assert one(hung, "gpu_exporter_source_up", source="dcgm") == 0
        assert (
            one(
                hung,
                "gpu_exporter_dcgm_errors_total",
                function="dcgmEntitiesGetLatestValues",
                error="timeout",
            )
            == 1
        )
        assert one(hung, "gpu_power_watts", gpu="0") > 0
        still = await rig.step()
        assert one(still, "gpu_exporter_source_up", source="dcgm") == 0
        rig.inject({"type": "unhang", "function": "dcgmEntitiesGetLatestValues"})
        await asyncio.to_thread(rig.sim.sampler_pool.wait_for_abandoned, 5.0)
        for _ in range(3):
            back = await rig.step()
    assert one(back, "gpu_exporter_source_up", source="dcgm") == 1
    assert one(back, "gpu_sm_active_ratio", gpu="1") == pytest.approx(0.02)
