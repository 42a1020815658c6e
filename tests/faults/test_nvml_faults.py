"""NVML faults through the whole exporter: a stuck GPU, intermittent errors, a GPU that drops
off and comes back. Each keeps the other GPUs, the scrapes and the Xid counts whole."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import Series, drained, one, select

from .rig import SCENARIO, drain, fault_rig, gpu_families


def hung_calls(series: Series) -> float:
    return one(series, "gpu_exporter_nvml_hung_calls")


def energy(series: Series, gpu: str) -> float:
    return one(series, "gpu_energy_joules_total", gpu=gpu)


def errors(series: Series, **labels: str) -> float:
    return sum(select(series, "gpu_exporter_nvml_errors_total", **labels).values())


async def test_a_stuck_gpu_holds_up_nothing_else_and_healthz_names_it(tmp_path: Path) -> None:
    async with fault_rig(tmp_path) as rig:
        rig.xid(0, 13)
        rig.inject({"type": "hang", "gpu": 1})  # every NVML call on GPU 1 blocks
        stuck = await rig.until("GPU 1's calls given up on", lambda s: hung_calls(s) > 0)
        rig.xid(0, 31)
        rig.xid(1, 48, delivery="kmsg")  # the kernel log still reports the stuck GPU
        rig.xid(2, 43)
        later = await rig.until(
            "GPU 0 and 2 still sampled", lambda s: energy(s, "0") > energy(stuck, "0")
        )
        assert energy(later, "2") > energy(stuck, "2"), "GPU 2 must keep updating"
        assert one(later, "gpu_up", gpu="1") == 1, "a stuck GPU is not a lost one"
        assert one(later, "gpu_exporter_collector_success", collector="power") == 0
        status, body = await rig.get("/healthz")
        assert status == 200, "a stuck device must not fail the liveness probe"
        assert "gpu 1" in body, f"/healthz does not name the stuck GPU:\n{body}"
        assert "hung" in body, f"/healthz does not say the GPU's calls hang:\n{body}"
        assert "gpu 0" not in body, f"a healthy GPU is reported degraded:\n{body}"

        rig.inject({"type": "unhang", "gpu": 1})
        await rig.until(
            "every collector succeeding on GPU 1 again",
            lambda s: (
                hung_calls(s) == 0
                and set(select(s, "gpu_exporter_collector_success").values()) == {1.0}
            ),
        )
        assert await rig.get("/healthz") == (200, "ok\n"), "/healthz still reports degradation"
        await rig.assert_xids_exact()


async def test_intermittent_unknown_errors_cost_only_the_failing_reads(tmp_path: Path) -> None:
    async with fault_rig(tmp_path) as rig:
        rig.inject(
            {"type": "nvml_error", "function": "nvmlDeviceGetPowerUsage", "gpu": 0, "every": 2}
        )
        rig.xid(0, 13)
        series = await rig.until(
            "three failed power reads on GPU 0",
            lambda s: errors(s, function="nvmlDeviceGetPowerUsage", error="unknown") >= 3,
        )
        assert one(series, "gpu_up", gpu="0") == 1, "an Unknown error must not mark a GPU lost"
        assert {"gpu_memory_used_bytes", "gpu_temperature_celsius"} <= gpu_families(series, "0")
        rig.xid(0, 31)
        await rig.assert_xids_exact()


async def test_a_gpu_is_lost_answer_from_a_gpu_that_still_answers_does_not_drop_it(
    tmp_path: Path,
) -> None:
    async with fault_rig(tmp_path) as rig:
        rig.xid(1, 13)
        await rig.settle()
        rig.inject(
            {
                "type": "nvml_error",
                "function": "nvmlDeviceGetTemperature",
                "gpu": 1,
                "error": "gpu_is_lost",
                "times": 1,
            }
        )
        seen: list[Series] = []

        def probed_and_sampled_again(series: Series) -> bool:
            seen.append(series)
            return (
                errors(series, function="nvmlDeviceGetTemperature", error="gpu_is_lost") == 1
                and one(series, "gpu_exporter_collector_success", collector="temperature") == 1
            )

        back = await rig.until("GPU 1 probed and sampled again", probed_and_sampled_again)
        assert all(one(s, "gpu_up", gpu="1") == 1 for s in seen), (
            "a GPU that can still be looked up must not be reported lost"
        )
        assert drain(back, "1", "device_lost") == 0, "no drain for a GPU that was never lost"
        assert "gpu_temperature_celsius" in gpu_families(back, "1")
        rig.xid(1, 31)
        await rig.assert_xids_exact()


async def test_a_gpu_lost_until_reset_withdraws_its_series_and_the_reset_clears_its_drain(
    tmp_path: Path,
) -> None:
    async with fault_rig(tmp_path) as rig:
        rig.xid(1, 48)  # hardware: drain
        rig.xid(1, 13)
        # A lost GPU's pending NVML events are gone with it (its kernel lines stay): let both
        # sources deliver first, so the tally of reports holds.
        await rig.settle()
        rig.inject({"type": "gpu_lost", "gpu": 1})
        rig.xid(1, 79, delivery="kmsg")  # fallen off the bus: kernel log only
        rig.xid(0, 13, delivery="nvml")  # while the event set is being rebuilt
        lost = await rig.until(
            "GPU 1 down and a re-probe failed",
            lambda s: (
                one(s, "gpu_up", gpu="1") == 0
                and errors(s, function="nvmlDeviceGetHandleByIndex", error="gpu_is_lost") >= 1
                and drain(s, "1", "device_lost") == 1  # set off the event loop, a moment later
            ),
        )
        assert "gpu_energy_joules_total" not in gpu_families(lost, "1"), (
            "a lost GPU's telemetry stays"
        )
        assert drain(lost, "1", "hardware_xid") == 1
        assert one(lost, "gpu_up", gpu="0") == 1
        # The NVML event set is rebuilt without the lost GPU: the other GPUs' events must
        # survive that, even with no kernel line to fall back on.
        rig.xid(0, 31, delivery="nvml")
        rig.xid(2, 43)

        rig.inject({"type": "gpu_recovered", "gpu": 1})  # a GPU reset
        await rig.until(
            "GPU 1 back with its series",
            lambda s: (
                one(s, "gpu_up", gpu="1") == 1 and "gpu_energy_joules_total" in gpu_families(s, "1")
            ),
        )
        await rig.until(
            "GPU 1's drain cleared by the reset",
            lambda s: drain(s, "1", "device_lost") == 0 and drain(s, "1", "hardware_xid") == 0,
        )
        rig.xid(1, 31)
        await rig.assert_xids_exact()


async def test_a_gpu_lost_before_startup_recommends_a_drain_until_it_answers(
    tmp_path: Path,
) -> None:
    lost_from_the_start = SCENARIO + "timeline:\n  - {at: 0s, type: gpu_lost, gpu: 1}\n"
    async with fault_rig(tmp_path, lost_from_the_start) as rig:
        rig.xid(0, 13)
        lost = await rig.until("GPU 1 down", lambda s: one(s, "gpu_up", gpu="1") == 0)
        assert drained(lost, "device_lost", gpu="1", uuid="") == 1, (
            "a GPU that never answered has no uuid, but its node must still be drained"
        )
        assert drain(lost, "1", "hardware_xid") == 0
        assert drain(lost, "0", "device_lost") == 0

        rig.inject({"type": "gpu_recovered", "gpu": 1})  # a GPU reset
        back = await rig.until("GPU 1 identified", lambda s: one(s, "gpu_up", gpu="1") == 1)
        assert not select(back, "gpu_drain_recommended", uuid=""), (
            "once the GPU answers, its unnamed drain series must go"
        )
        assert drain(back, "1", "device_lost") == 0
        # Kernel line only: NVML events reach a GPU once the event thread has registered it, a
        # moment after it is identified, and a report that never comes would spoil the tally.
        rig.xid(1, 31, delivery="kmsg")
        await rig.assert_xids_exact()
