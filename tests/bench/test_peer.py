"""The peer comparison of ``make bench`` (bench/peer.py) in a tiny smoke mode, so it cannot rot:
both exporters start on the same simulated node, both meter the simulator, both answer scrapes in
both connection modes, and the report and goals are built from what was measured. It checks
that the numbers exist and make sense, never how fast anything was."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from goals import resting_cpu  # noqa: E402
from peer import MODES, OURS, PEER, PEER_SMOKE, compare, peer_table  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("gpu-exporter-simulate", path=str(Path(sys.executable).parent)) is None,
    reason="the gpu-exporter-simulate script is not installed next to this interpreter",
)


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    return compare(ROOT / "bench" / "scenarios" / "gpu8.yaml", PEER_SMOKE, no_kubelet=False)


def test_both_exporters_serve_the_same_simulated_node(result: dict[str, Any]) -> None:
    servers = result["servers"]
    assert set(servers) == {OURS, PEER}, f"the run must hold both exporters: {sorted(servers)}"
    for name, data in servers.items():
        served = f"{name} served {data['series']} series in {data['families']} families"
        assert data["series"] > 100, served
        assert data["families"] > 10, served
    assert result["peer_version"] == "1.7.2", "the pinned nvitop-exporter is the one measured"


def test_the_simulator_is_metered_in_both_processes(result: dict[str, Any]) -> None:
    for name, data in result["servers"].items():
        idle = data["idle"]
        assert idle["nvml_calls_per_second_p50"] > 0, f"{name}: no NVML call was metered"
        assert 0 <= idle["share_percent_net_p50"] <= idle["share_percent_raw_p50"], (
            f"{name}: net of the simulator cannot exceed the raw share: {idle}"
        )
        assert data["peak_rss_mib"] > 10, f"{name}: VmHWM not read: {data['peak_rss_mib']}"


def test_every_server_answers_in_both_connection_modes(result: dict[str, Any]) -> None:
    for name, data in result["servers"].items():
        for mode in MODES:
            cell = data["scrapes"][mode]
            assert cell["scrapes"] >= 1, f"{name} {mode}: no scrape answered: {cell}"
            assert cell["p50_ms"] <= cell["p99_ms"], f"{name} {mode}: {cell}"


def test_the_table_and_the_resting_cpu_goal_come_from_the_run(result: dict[str, Any]) -> None:
    table = peer_table(result)
    assert f"| {PEER} | {OURS} |" in table.splitlines()[0], table
    assert "new connection" in table, table
    assert "NVML calls/s" in table, table
    verdict = resting_cpu(result)
    idle = {name: data["idle"]["share_percent_net_p50"] for name, data in result["servers"].items()}
    if idle[PEER] > 0:
        assert verdict.measured == idle[OURS] / idle[PEER], f"not our share over theirs: {idle}"
        assert isinstance(verdict.met, bool), verdict
    else:
        assert verdict.met is None, f"judged against a peer measured at 0%: {verdict}"
