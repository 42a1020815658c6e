"""The placement cases of demo/scenarios/placement.yaml (and the GB200 pair) as the exporter will
read them: each case's path, best path, NUMA alignment and activity bands, and the good
placements quiet."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pynvml
import pytest

from gpu_exporter.devices import discover_gpu
from gpu_exporter.nvml import DeviceCalls, ErrorCounter, SupportRegistry
from gpu_exporter.simulator import SimulatedNode, install, load_scenario, uninstall
from gpu_exporter.simulator.scenario import AllocationSpec
from gpu_exporter.topology.paths import (
    PathKind,
    Placement,
    Topology,
    memory_aligned_ratio,
    numa_aligned_ratio,
    placements,
)
from gpu_exporter.topology.read import read_topology
from tests.dcgm.helpers import dcgm_rig
from tests.helpers import one, select, simulated_sampler

SCENARIOS = Path(__file__).resolve().parents[2] / "demo" / "scenarios"
PLACEMENT = SCENARIOS / "placement.yaml"


def read(path: Path | None) -> tuple[Topology, list[str], list[AllocationSpec]]:
    """The node's topology as the exporter reads it, its GPUs' UUIDs by index, and what the
    kubelet lists (the scenario's allocations: the wiring will read them from pod-resources)."""
    scenario = load_scenario(path)
    node = SimulatedNode(scenario)
    install(node)
    pynvml.nvmlInit()
    try:
        support, errors = SupportRegistry(), ErrorCounter()
        gpus = [discover_gpu(i, support, errors).device for i in range(len(scenario.gpus))]
        topology = read_topology(
            gpus, lambda d: DeviceCalls(d.uuid, support, errors, collector="topology"), None
        )
    finally:
        pynvml.nvmlShutdown()
        uninstall()
        node.close()
    return topology, [g.uuid for g in gpus], list(scenario.allocations)


def placed_pods(path: Path | None) -> dict[str, Placement]:
    topology, uuids, allocations = read(path)
    held: dict[str, set[str]] = defaultdict(set)
    for allocation in allocations:
        held[allocation.pod].add(uuids[allocation.gpu])
    return placements(topology, held, uuids)


def test_the_badly_placed_pod_crosses_sockets_where_one_switch_was_free() -> None:
    placed = placed_pods(PLACEMENT)
    assert placed["tp-split"] == Placement(PathKind.SYSTEM, PathKind.PCIE_SWITCH)
    assert placed["tp-split"].could_have_been_better
    single = [pod for pod in placed if pod != "tp-split"]
    assert all(placed[pod].path is None for pod in single), "one GPU: no path, nothing to say"


def test_the_cross_socket_container_has_none_of_its_cpus_on_its_gpus_node() -> None:
    topology, uuids, allocations = read(PLACEMENT)
    ratios = {}
    for allocation in allocations:
        if allocation.cpu_ids:
            gpu = uuids[allocation.gpu]
            ratios[allocation.pod] = (
                numa_aligned_ratio(allocation.cpu_ids, topology.local_cpus[gpu]),
                memory_aligned_ratio(allocation.memory_numa_nodes, topology.numa_nodes[gpu]),
            )
    assert ratios["loader-far"] == (0.0, 0.0)
    assert ratios["starved"] == ratios["steady"] == ratios["tp-split"] == (1.0, 1.0), "quiet"


def test_the_builtin_hgx_trainer_is_on_nvlink() -> None:
    placed = placed_pods(None)
    assert placed["llama-pretrain-0"] == Placement(PathKind.NVLINK, PathKind.NVLINK)


@pytest.mark.parametrize("tray", ["placement-gb200-clique1.yaml", "placement-gb200-clique2.yaml"])
def test_gb200_trays_keep_each_pod_on_nvlink(tray: str) -> None:
    placed = placed_pods(SCENARIOS / tray)
    assert placed["llm-split-0" if "clique1" in tray else "llm-split-1"].path == PathKind.NVLINK


async def test_the_two_gb200_trays_are_two_nvlink_domains_of_one_cluster() -> None:
    cliques = {}
    for name in ("placement-gb200-clique1.yaml", "placement-gb200-clique2.yaml"):
        async with simulated_sampler((SCENARIOS / name).read_text()) as sim:
            series = await sim.slow_round()
        (labels,) = (dict(key) for key in select(series, "gpu_fabric_info", gpu="0"))
        cliques[name] = (labels["cluster_uuid"], labels["clique_id"])
    first, second = cliques.values()
    assert first[0] == second[0], "one cluster"
    assert first[1] != second[1], "llm-split's pods sit in two cliques"


async def test_the_starved_and_the_steady_holder_land_in_different_bands() -> None:
    # L40S has no GPM: SM activity comes from the node's DCGM host engine.
    async with dcgm_rig(PLACEMENT.read_text(), "--collector.activity.detail") as rig:
        for _ in range(3):
            await rig.step()
        start = await rig.step()
        for _ in range(40):
            end = await rig.step()

    def share(gpu: str, band: str) -> float:
        name = "gpu_sm_activity_band_seconds_total"
        return (one(end, name, gpu=gpu, band=band) - one(start, name, gpu=gpu, band=band)) / 40

    def mean(gpu: str) -> float:
        name = "gpu_sm_active_seconds_total"
        return (one(end, name, gpu=gpu) - one(start, name, gpu=gpu)) / 40

    starved, steady = "2", "3"
    assert mean(starved) == pytest.approx(mean(steady), rel=0.1), "the same mean"
    assert share(starved, "high") + share(starved, "low") >= 0.9
    assert share(starved, "mid") <= 0.1
    assert share(steady, "mid") >= 0.95
