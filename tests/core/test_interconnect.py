"""NVLink and PCIe through the real pynvml module against the simulator's NVML."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from gpu_exporter.collectors import fields
from gpu_exporter.nvml.calls import FieldKey, FieldRequest
from tests.helpers import one, select, simulated_sampler

BUSY_H100 = """
    gpus: [{model: H100-SXM-80GB, count: 2}]
    workloads: [{gpu: 0, pod: p, sm: 0.9, tensor: 0.5, dram: 0.4}]
"""


async def test_an_h100_reports_its_18_links_and_sums_errors_and_traffic_over_them() -> None:
    async with simulated_sampler(BUSY_H100) as sim:
        await sim.slow_round()
        await sim.fast_round()
        sim.inject({"type": "nvlink_errors", "gpu": 0, "link": [3, 7], "crc_flit": 5, "replay": 2})
        sim.inject({"type": "nvlink_errors", "gpu": 0, "link": 3, "crc_data": 1})
        start = await sim.fast_round()
        end = await sim.fast_round()
    assert one(end, "gpu_nvlink_links", gpu="0", state="active") == 18
    assert not select(end, "gpu_nvlink_links", state="inactive"), "none down: nothing to count"
    assert select(end, "gpu_nvlink_link_active") == {}, "links that are up are a count, not named"
    assert one(end, "gpu_nvlink_errors_total", gpu="0", type="crc") == 11, (
        "5 flit CRC errors on each of 2 links and 1 data CRC error: one CRC count per GPU"
    )
    assert one(end, "gpu_nvlink_errors_total", gpu="0", type="replay") == 4
    assert one(end, "gpu_nvlink_errors_total", gpu="1", type="crc") == 0, "the other GPU is clean"
    assert {dict(k)["type"] for k in select(end, "gpu_nvlink_errors_total", gpu="0")} == {
        "crc",
        "replay",
        "recovery",
        "ecc",
    }
    assert not any("link" in dict(k) for k in select(end, "gpu_nvlink_errors_total")), (
        "without per-link, errors carry no link label"
    )
    # 18 links x 25 GB/s x 40% of the bandwidth while the tensor pipes are 50% busy, for 1 s.
    sent = one(end, "gpu_nvlink_transmit_bytes_total", gpu="0") - one(
        start, "gpu_nvlink_transmit_bytes_total", gpu="0"
    )
    assert sent == pytest.approx(18 * 25e9 * 0.4 * 0.5, abs=18 * 1024), "NVML counts KiB"
    assert one(end, "gpu_nvlink_receive_bytes_total", gpu="1") == 0, "an idle GPU moves nothing"


async def test_a_link_that_goes_down_is_named_and_no_longer_counted_active() -> None:
    async with simulated_sampler(BUSY_H100) as sim:
        await sim.slow_round()
        sim.inject({"type": "nvlink_down", "gpu": 1, "link": 5})
        series = await sim.slow_round()
    assert select(series, "gpu_nvlink_link_active") == {
        frozenset({("gpu", "1"), ("uuid", sim.node.gpus[1].uuid), ("link", "5")}): 0.0
    }, "only the link that is down has a series of its own"
    assert one(series, "gpu_nvlink_links", gpu="1", state="active") == 17
    assert one(series, "gpu_nvlink_links", gpu="0", state="active") == 18
    assert not select(series, "gpu_nvlink_links", state="inactive"), "the down link is named"


async def test_per_link_mode_names_every_link_with_its_state() -> None:
    async with simulated_sampler(BUSY_H100, "--collector.nvlink.per-link") as sim:
        await sim.slow_round()
        sim.inject({"type": "nvlink_down", "gpu": 1, "link": 5})
        series = await sim.slow_round()
    links = select(series, "gpu_nvlink_link_active", gpu="1")
    assert len(links) == 18
    assert sum(links.values()) == 17
    assert one(series, "gpu_nvlink_links", gpu="1", state="active") == 17


async def test_per_link_mode_labels_errors_and_traffic_by_link() -> None:
    async with simulated_sampler(BUSY_H100, "--collector.nvlink.per-link") as sim:
        await sim.slow_round()
        await sim.fast_round()
        sim.inject({"type": "nvlink_errors", "gpu": 0, "link": 3, "crc_data": 7, "crc_flit": 2})
        await sim.fast_round()
        series = await sim.slow_round()
    # Per link, the flit and data CRC counters stay apart: the detail the flag is for.
    assert one(series, "gpu_nvlink_errors_total", gpu="0", link="3", type="crc_data") == 7
    assert one(series, "gpu_nvlink_errors_total", gpu="0", link="3", type="crc_flit") == 2
    assert one(series, "gpu_nvlink_errors_total", gpu="0", link="4", type="crc_data") == 0
    assert not select(series, "gpu_nvlink_errors_total", type="crc")
    assert len(select(series, "gpu_nvlink_transmit_bytes_total", gpu="0")) == 18
    assert not select(series, "gpu_nvlink_errors_total", gpu="0", type="crc_data").keys() - {
        k for k in select(series, "gpu_nvlink_errors_total", gpu="0") if "link" in dict(k)
    }, "no unlabelled total beside the per-link series (sums would double count)"


async def test_a_pcie_card_has_pcie_series_and_no_nvlink_series() -> None:
    async with simulated_sampler("gpus: [{model: L40S}]") as sim:
        await sim.slow_round()
        await sim.fast_round()
        series = await sim.fast_round()
    assert not [name for name, _ in series if name.startswith("gpu_nvlink")], "omitted, not zero"
    assert one(series, "gpu_pcie_link_max_generation") == 4
    assert one(series, "gpu_pcie_link_width_lanes") == 16
    assert one(series, "gpu_pcie_replays_total") == 0
    assert one(series, "gpu_pcie_transmit_bytes_total") > 0


async def test_blackwell_reports_nvlink5_counters_instead_of_the_dl_totals() -> None:
    async with simulated_sampler("gpus: [{model: B200-SXM-180GB}]") as sim:
        await sim.slow_round()
        await sim.fast_round()
        sim.inject({"type": "nvlink_errors", "gpu": 0, "link": "all", "symbol": 2, "recovery": 1})
        series = await sim.fast_round()
    types = {dict(k)["type"] for k in select(series, "gpu_nvlink_errors_total")}
    assert types == {"rx_errors", "recovery", "recovery_failed", "effective", "symbol"}
    assert one(series, "gpu_nvlink_errors_total", type="symbol") == 36
    assert one(series, "gpu_nvlink_errors_total", type="recovery") == 18


async def test_pcie_downtraining_shows_in_width_and_generation_drops_only_at_idle() -> None:
    async with simulated_sampler(BUSY_H100, "--collector.pcie.errors") as sim:
        series = await sim.slow_round()
        assert one(series, "gpu_pcie_link_generation", gpu="0") == 5, "busy: full speed"
        assert one(series, "gpu_pcie_link_generation", gpu="1") == 1, "idle: power saving"
        assert one(series, "gpu_pcie_link_width_lanes", gpu="1") == 16, (
            "width does not drop at idle"
        )
        sim.inject({"type": "pcie_downtrain", "gpu": 0, "width": 8})
        sim.inject({"type": "pcie_errors", "gpu": 0, "replays": 40, "correctable": 3})
        sim.clock.advance(30)  # the next slow round
        series = await sim.slow_round()
        await sim.fast_round()
        counters = await sim.fast_round()
    assert one(series, "gpu_pcie_errors_total", gpu="0", type="correctable") == 3, "slow cadence"
    assert one(series, "gpu_pcie_link_width_lanes", gpu="0") == 8
    assert one(series, "gpu_pcie_link_max_width_lanes", gpu="0") == 16
    assert one(series, "gpu_pcie_link_width_lanes", gpu="1") == 16, "the other GPU is untouched"
    assert one(counters, "gpu_pcie_replays_total", gpu="0") == 40
    assert one(counters, "gpu_pcie_replays_total", gpu="1") == 0


async def test_every_field_signal_of_a_fast_round_comes_from_one_field_read_per_gpu() -> None:
    async with simulated_sampler(BUSY_H100) as sim:
        await sim.slow_round()
        await sim.fast_round()
        await sim.fast_round()
        before = Counter(sim.node.calls)
        await sim.fast_round()
        after = Counter(sim.node.calls)
    assert after["nvmlDeviceGetFieldValues"] - before["nvmlDeviceGetFieldValues"] == 2, (
        "one nvmlDeviceGetFieldValues per GPU carries temperature, energy, clock-event, "
        "recovery, NVLink and PCIe fields"
    )
    per_gpu = (sum(after.values()) - sum(before.values())) / 2
    assert per_gpu <= 11, f"the fast round asks {per_gpu} NVML calls per GPU (14 before batching)"


async def test_a_gpus_field_array_is_built_once_and_reused_round_after_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[tuple[object, ...]] = []

    class CountedRequest(FieldRequest):
        def __init__(self, keys: Sequence[FieldKey]) -> None:
            super().__init__(keys)
            built.append(self.keys)

    monkeypatch.setattr(fields, "FieldRequest", CountedRequest)
    async with simulated_sampler(BUSY_H100) as sim:
        await sim.fast_round()
        await sim.fast_round()  # the first round learns which fields the GPUs lack
        settled = len(built)
        for _ in range(3):
            series = await sim.fast_round()
    assert len(built) == settled, "a field array was rebuilt though the fields did not change"
    assert one(series, "gpu_pcie_replays_total", gpu="0") == 0, "the reused array still answers"
    assert one(series, "gpu_energy_joules_total", gpu="0") > 0
