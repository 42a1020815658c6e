"""``make fleet``: real simulated exporters replayed as N nodes that a real Prometheus scrapes
through the written ``file_sd`` targets, each node with an identity of its own."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from demo.fleet import TRAYS_PER_RACK, Fleet, plan
from demo.stack import PrometheusProcess, wait_ready

from tests.conftest import require_binary

module_loop = pytest.mark.asyncio(loop_scope="module")

NODES = 8  # two of each shape
GPUS = {"h100": 8, "mig56": 8, "b200": 8, "gb200": 4}
DEADLINE = 45.0


def test_nodes_take_the_shapes_in_turn_and_gb200_trays_fill_racks_of_18() -> None:
    nodes = plan(4 * (TRAYS_PER_RACK + 1))
    assert [n.shape.name for n in nodes[:5]] == ["h100", "mig56", "b200", "gb200", "h100"]
    trays = [n for n in nodes if n.shape.name == "gb200"]
    source = "5f3f2a52-96a4-4e0c-8a7e-6d1b7d1f2e30"
    racks = [tray.relabel("cluster_uuid", source) for tray in trays]
    assert len(set(racks[:TRAYS_PER_RACK])) == 1, "the first 18 trays are one rack"
    assert racks[TRAYS_PER_RACK] != racks[0], "the 19th tray starts the next rack"
    zero = "00000000-0000-0000-0000-000000000000"
    assert trays[0].relabel("cluster_uuid", zero) == zero, "an HGX fabric has no cluster"


def test_identity_labels_differ_per_node_and_keep_their_form() -> None:
    first, second = plan(2)
    gpu = "GPU-a651795c-a212-5d44-8fd1-51806f462537"
    assert first.relabel("uuid", gpu) != second.relabel("uuid", gpu)
    assert first.relabel("uuid", gpu).startswith("GPU-")
    assert len(first.relabel("uuid", gpu)) == len(gpu)
    assert first.relabel("parent_uuid", gpu) == first.relabel("uuid", gpu)
    assert first.relabel("uuid", "MIG-" + gpu[4:]).startswith("MIG-")
    assert len(first.relabel("serial", "1650206572165")) == 13
    assert second.relabel("pci_bus_id", "00000000:18:00.0") == "00000001:18:00.0"
    assert second.relabel("pod", "train-0") == "train-0-00001"
    assert first.relabel("namespace", "research") == "research"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def scraped() -> AsyncIterator[tuple[Fleet, PrometheusProcess]]:
    prometheus_binary = require_binary("prometheus")
    workdir = Path(tempfile.mkdtemp(prefix="gx-fleet-test-"))
    fleet = Fleet(NODES, workdir / "fleet")
    await fleet.start()
    prometheus: PrometheusProcess | None = None
    try:
        targets = workdir / "targets.json"
        targets.write_text(json.dumps(fleet.file_sd()))
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {"job_name": "fleet", "file_sd_configs": [{"files": [str(targets)]}]}
            ],
        }
        prometheus = PrometheusProcess(prometheus_binary, config, workdir / "prometheus")
        await asyncio.to_thread(wait_ready, f"{prometheus.url}/-/ready", prometheus)
        yield fleet, prometheus
    finally:
        if prometheus is not None:
            await asyncio.to_thread(prometheus.stop)
        await fleet.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def instant(prometheus: PrometheusProcess, expr: str) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{prometheus.url}/api/v1/query", params={"query": expr}) as response,
    ):
        body = await response.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


async def value_of(prometheus: PrometheusProcess, expr: str, want: float) -> float:
    """``expr``'s single value once it equals ``want`` (or the last one seen, at the deadline)."""
    deadline = time.monotonic() + DEADLINE
    got = float("nan")
    while time.monotonic() < deadline:
        result = await instant(prometheus, expr)
        got = float(result[0]["value"][1]) if result else float("nan")
        if got == want:
            break
        await asyncio.sleep(0.5)
    return got


@module_loop
async def test_every_node_is_a_target_of_its_own(scraped: tuple[Fleet, PrometheusProcess]) -> None:
    _, prometheus = scraped
    assert await value_of(prometheus, 'count(up{job="fleet"} == 1)', NODES) == NODES
    nodes = await instant(prometheus, 'count by (node, instance) (up{job="fleet"})')
    assert {r["metric"]["node"] for r in nodes} == {f"gpu-node-{i:05d}" for i in range(NODES)}


@module_loop
async def test_every_gpu_of_the_fleet_has_a_uuid_of_its_own(
    scraped: tuple[Fleet, PrometheusProcess],
) -> None:
    _, prometheus = scraped
    gpus = 2 * sum(GPUS.values())
    assert await value_of(prometheus, "count(gpu_info)", gpus) == gpus
    assert await value_of(prometheus, "count(count by (uuid) (gpu_info))", gpus) == gpus
    per_node = await instant(
        prometheus, "count by (node) (count by (node, namespace, pod) (gpu_allocation_info))"
    )
    in_fleet = await instant(prometheus, "count(count by (namespace, pod) (gpu_allocation_info))")
    assert per_node, "the replayed nodes serve their allocations"
    assert sum(float(r["value"][1]) for r in per_node) == float(in_fleet[0]["value"][1]), (
        "a pod name is never on two nodes"
    )


@module_loop
async def test_a_node_serves_its_shapes_exposition(
    scraped: tuple[Fleet, PrometheusProcess],
) -> None:
    fleet, prometheus = scraped
    per_node = await instant(prometheus, 'count by (node) ({job="fleet", __name__=~"gpu_.*"})')
    counts = {r["metric"]["node"]: int(r["value"][1]) for r in per_node}
    for node in fleet.nodes:
        twin = fleet.nodes[(node.index + 4) % NODES]
        assert counts[node.name] == counts[twin.name], f"{node.name} and {twin.name} differ"
    assert len(set(counts.values())) == len(GPUS), "each shape has its own exposition"


@module_loop
async def test_the_trays_of_a_rack_share_one_nvlink_domain(
    scraped: tuple[Fleet, PrometheusProcess],
) -> None:
    _, prometheus = scraped
    domains = 'count(count by (cluster_uuid) (gpu_fabric_info{cluster_uuid!~"0+-.*"}))'
    assert await value_of(prometheus, domains, 1) == 1
