"""Xids through the whole exporter: kernel log and NVML events in, one count out, kept across
restarts, and drain latches from the sampler's own findings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from gpu_exporter.app import Exporter
from gpu_exporter.collectors import Cadence
from gpu_exporter.config import SimulatorConfig
from gpu_exporter.simulator import SimulatedNode
from tests.helpers import (
    Series,
    drained,
    make_config,
    one,
    parse_exposition,
    running_simulation,
    select,
)

SCENARIO = """
gpus: [{model: H100-SXM-80GB, count: 2}]
workloads:
  - {gpu: 0, pod: trainer, namespace: ml, pid: 4242, process_name: python, sm: 0.9}
"""
GPU1_XID48 = "NVRM: Xid (PCI:0000:2a:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable DBE"


@asynccontextmanager
async def exporter_on(tmp_path: Path) -> AsyncIterator[tuple[Exporter, SimulatedNode]]:
    scenario = tmp_path / "node.yaml"
    scenario.write_text(SCENARIO)
    config = make_config(
        simulator=SimulatorConfig(scenario),
        fast_interval=0.2,
        slow_interval=0.5,
        kmsg_path=tmp_path / "kmsg",
        state_dir=tmp_path / "state",
    )
    async with running_simulation(config) as (exporter, simulated):
        yield exporter, simulated.node


async def scrape(exporter: Exporter) -> Series:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{exporter.port}/metrics") as response,
    ):
        return parse_exposition(await response.text())


async def until(exporter: Exporter, condition: str, check: object) -> Series:
    """Scrape after each render until ``check(series)`` holds (bounded: 50 renders)."""
    for _ in range(50):
        series = await scrape(exporter)
        if check(series):  # type: ignore[operator]
            return series
        await exporter.sampler.wait_for_news()
    raise AssertionError(f"never saw: {condition}")


def xid_total(series: Series) -> float:
    return sum(select(series, "gpu_xid_errors_total").values())


def append_kmsg(path: Path, seq: int, message: str) -> None:
    with path.open("a") as kmsg:
        kmsg.write(f"3,{seq},{seq * 1000},-;{message}\n")


async def test_a_kernel_log_xid_is_counted_classified_and_latches_drain(tmp_path: Path) -> None:
    async with exporter_on(tmp_path) as (exporter, _node):
        append_kmsg(tmp_path / "kmsg", 1, GPU1_XID48)
        series = await until(exporter, "Xid 48 counted", lambda s: xid_total(s) == 1)
        labels = {"gpu": "1", "xid": "48", "class": "hardware", "namespace": "", "pod": ""}
        assert one(series, "gpu_xid_errors_total", **labels) == 1
        assert drained(series, "hardware_xid", gpu="1") == 1
        assert drained(series, "hardware_xid", gpu="0") == 0
        assert one(series, "gpu_exporter_source_up", source="kmsg") == 1
        assert one(series, "gpu_exporter_source_up", source="nvml") == 1


async def test_an_xid_from_both_sources_counts_once_with_the_pod(tmp_path: Path) -> None:
    async with exporter_on(tmp_path) as (exporter, node):
        node.inject({"type": "xid", "gpu": 0, "code": 13, "delivery": "both"})
        series = await until(exporter, "Xid 13 counted", lambda s: xid_total(s) >= 1)
        for _ in range(5):  # give a duplicate every chance to show up
            await exporter.sampler.wait_for_rounds(Cadence.FAST, 1)
        series = await scrape(exporter)
        assert xid_total(series) == 1
        assert one(series, "gpu_xid_errors_total", gpu="0", xid="13") == 1
        assert one(series, "gpu_xid_errors_total", **{"class": "application"}) == 1


async def test_counts_and_drain_survive_a_restart(tmp_path: Path) -> None:
    async with exporter_on(tmp_path) as (exporter, _node):
        append_kmsg(tmp_path / "kmsg", 1, GPU1_XID48)
        await until(exporter, "Xid 48 counted", lambda s: xid_total(s) == 1)
    async with exporter_on(tmp_path) as (restarted, _node):
        append_kmsg(tmp_path / "kmsg", 2, GPU1_XID48.replace("48,", "13,"))
        series = await until(restarted, "second Xid counted", lambda s: xid_total(s) == 2)
        assert one(series, "gpu_xid_errors_total", gpu="1", xid="48") == 1, "replay counted twice"
        assert drained(series, "hardware_xid", gpu="1") == 1


async def test_a_row_remap_failure_seen_by_the_sampler_recommends_a_drain(tmp_path: Path) -> None:
    async with exporter_on(tmp_path) as (exporter, node):
        node.inject({"type": "row_remap_failure", "gpu": 0})
        # The remap collector tells the drain source from its worker as it reads the failure;
        # its own gauge is published when the round settles, which may be a render later.
        await until(
            exporter,
            "drain for the remap failure, and the failed-remap gauge",
            lambda s: (
                bool(select(s, "gpu_drain_recommended", gpu="0", reason="row_remap_failure"))
                and drained(s, "row_remap_failure", gpu="0") == 1
                and one(s, "gpu_row_remap_failed", gpu="0") == 1
            ),
        )


async def test_a_lost_gpu_recommends_a_drain(tmp_path: Path) -> None:
    async with exporter_on(tmp_path) as (exporter, node):
        node.inject({"type": "gpu_lost", "gpu": 1})
        series = await until(
            exporter,
            "drain for the lost GPU",
            lambda s: drained(s, "device_lost", gpu="1") == 1,
        )
        assert one(series, "gpu_up", gpu="1") == 0


async def test_a_simulated_nvswitch_sxid_is_counted_by_switch_and_severity(tmp_path: Path) -> None:
    async with exporter_on(tmp_path) as (exporter, node):
        node.inject({"type": "sxid", "switch": 2, "code": 24007, "severity": "fatal"})
        series = await until(
            exporter,
            "the SXid counted",
            lambda s: select(s, "gpu_nvswitch_sxid_errors_total"),
        )
        labels = {"switch": "2", "pci_bus_id": "0000:07:00.0", "sxid": "24007"}
        assert one(series, "gpu_nvswitch_sxid_errors_total", severity="fatal", **labels) == 1
        assert xid_total(series) == 0, "an NVSwitch error is not a GPU Xid"
