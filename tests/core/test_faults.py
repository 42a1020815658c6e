"""NVML's error kinds: each degrades only its own series, visibly, and recovers by itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from tests.helpers import one, select, simulated_sampler

THREE_BUSY_GPUS = """
    gpus: [{model: H100-SXM-80GB, count: 3}]
    workloads:
      - {gpu: 0, pod: a, sm: 0.5}
      - {gpu: 1, pod: b, sm: 0.5}
      - {gpu: 2, pod: c, sm: 0.5}
"""


def series_of_gpu(series: dict, gpu: str) -> set[str]:  # type: ignore[type-arg]
    return {name for (name, labels) in series if ("gpu", gpu) in labels}


async def test_a_lost_gpu_goes_down_alone_and_comes_back_after_a_reset() -> None:
    async with simulated_sampler(THREE_BUSY_GPUS) as sim:
        await sim.fast_round()
        before = await sim.fast_round()
        sim.inject({"type": "gpu_lost", "gpu": 1})
        await sim.fast_round()
        lost = await sim.fast_round()

        assert one(lost, "gpu_up", gpu="1") == 0
        assert one(lost, "gpu_up", gpu="0") == 1
        assert one(lost, "gpu_up", gpu="2") == 1
        # Only gpu_info and gpu_up remain for the lost GPU; its telemetry is withdrawn.
        assert series_of_gpu(lost, "1") == {"gpu_info", "gpu_up"}
        assert series_of_gpu(lost, "0") == series_of_gpu(before, "0")
        assert (
            sum(select(lost, "gpu_exporter_nvml_errors_total", error="gpu_is_lost").values()) >= 1
        )

        sim.inject({"type": "gpu_recovered", "gpu": 1})
        for _ in range(5):  # backoff starts at 1 s and doubles
            back = await sim.fast_round(2.0)
        assert one(back, "gpu_up", gpu="1") == 1
        assert "gpu_power_watts" in series_of_gpu(back, "1")


async def test_a_hung_call_fails_its_collector_on_that_gpu_only() -> None:
    async with simulated_sampler(THREE_BUSY_GPUS, nvml_timeout=0.5) as sim:
        first = await sim.fast_round()
        sim.inject({"type": "hang", "gpu": 1, "function": "nvmlDeviceGetPowerUsage"})
        hung = await sim.fast_round()
        still_hung = await sim.fast_round()

        timeouts = "gpu_exporter_nvml_errors_total"
        assert one(hung, timeouts, function="nvmlDeviceGetPowerUsage", error="timeout") == 1
        # Skipped while stuck, not re-submitted and re-counted every round.
        assert one(still_hung, timeouts, function="nvmlDeviceGetPowerUsage", error="timeout") == 1
        assert one(still_hung, "gpu_exporter_nvml_hung_calls") == 1
        assert one(still_hung, "gpu_exporter_collector_success", collector="power") == 0
        assert one(still_hung, "gpu_exporter_sample_age_seconds", collector="power") >= 2
        assert one(still_hung, "gpu_exporter_collector_success", collector="memory") == 1
        # A GPU's collectors run in turn on one worker; those queued behind the hung call
        # missed one round and run again once it is left out of the GPU's batch.
        assert one(still_hung, "gpu_exporter_collector_success", collector="clocks") == 1
        assert one(still_hung, "gpu_exporter_sample_age_seconds", collector="clocks") == 0

        # The other GPUs' energy keeps counting; the hung GPU serves its last value.
        def energy(series: dict, gpu: str) -> float:  # type: ignore[type-arg]
            return one(series, "gpu_energy_joules_total", gpu=gpu)

        assert energy(still_hung, "0") > energy(hung, "0") > energy(first, "0")
        assert energy(still_hung, "1") == energy(hung, "1") == energy(first, "1")

        sim.inject({"type": "unhang", "gpu": 1, "function": "nvmlDeviceGetPowerUsage"})
        assert await asyncio.to_thread(sim.sampler_pool.wait_for_abandoned, 10.0)
        recovered = await sim.fast_round()
        assert one(recovered, "gpu_exporter_collector_success", collector="power") == 1
        assert one(recovered, "gpu_exporter_nvml_hung_calls") == 0
        assert energy(recovered, "1") > energy(first, "1")


async def test_a_round_hands_the_pool_one_task_per_gpu_not_one_per_collector() -> None:
    async with simulated_sampler(THREE_BUSY_GPUS) as sim:
        await sim.fast_round()
        submitted: list[object] = []
        submit = sim.sampler_pool.submit

        def counted(fn: Callable[[], object]) -> Future[object]:
            submitted.append(fn)
            return submit(fn)

        sim.sampler_pool.submit = counted  # type: ignore[assignment]
        series = await sim.fast_round()
        tasks = len(submitted)
    assert tasks == 3, "a task costs a future and a thread hand-off: one per GPU"
    fast = {"activity", "utilization", "memory", "power", "temperature", "clocks"}
    for collector in fast:
        assert one(series, "gpu_exporter_collector_success", collector=collector) == 1


async def test_an_unexpected_error_omits_one_series_and_is_counted() -> None:
    async with simulated_sampler(THREE_BUSY_GPUS) as sim:
        sim.inject(
            {
                "type": "nvml_error",
                "gpu": 2,
                "function": "nvmlDeviceGetPowerUsage",
                "error": "unknown",
            }
        )
        await sim.fast_round()
        series = await sim.fast_round()
    assert select(series, "gpu_power_watts", gpu="2") == {}
    # The collector's other signals on that GPU still come through.
    assert one(series, "gpu_power_limit_watts", gpu="2") == 700
    assert one(series, "gpu_power_watts", gpu="0") > 0
    errors = one(series, "gpu_exporter_nvml_errors_total", function="nvmlDeviceGetPowerUsage")
    assert errors == 2
    assert one(series, "gpu_exporter_collector_success", collector="power") == 0


async def test_not_supported_is_asked_once_per_device_and_logged_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # NVML has no utilisation on MIG-enabled GPUs.
    scenario = "gpus: [{model: A100-SXM-80GB, count: 2, mig: [3g.40gb]}]"
    async with simulated_sampler(scenario) as sim:
        for _ in range(3):
            series = await sim.fast_round()
        asked = sim.node.calls["nvmlDeviceGetUtilizationRates"]
    assert asked == 2, "each GPU is asked once, then remembered as unsupported"
    assert select(series, "gpu_utilization_ratio") == {}
    assert one(series, "gpu_exporter_collector_success", collector="utilization") == 1
    logged = [line for line in capsys.readouterr().out.splitlines() if "UtilizationRates" in line]
    assert len(logged) == 1, logged
