"""Reading the topology through the real pynvml from the simulator's NVML, and from sysfs where
NVML does not answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpu_exporter.devices import Device, discover_gpu
from gpu_exporter.nvml import DeviceCalls, ErrorCounter, SupportRegistry
from gpu_exporter.simulator import SimulatedNode, install, loads_scenario, uninstall
from gpu_exporter.simulator.sysfs import write_pci_tree
from gpu_exporter.topology.paths import PathKind, placement
from gpu_exporter.topology.read import read_topology, sysfs_address


class Node:
    def __init__(self, scenario: str) -> None:
        self.sim = SimulatedNode(loads_scenario(scenario, "t.yaml"))
        install(self.sim)
        pynvml.nvmlInit()
        self.support, self.errors = SupportRegistry(), ErrorCounter()
        count = pynvml.nvmlDeviceGetCount()
        self.gpus = [discover_gpu(i, self.support, self.errors).device for i in range(count)]

    def calls_for(self, device: Device) -> DeviceCalls:
        return DeviceCalls(device.uuid, self.support, self.errors, collector="topology")

    def uuid(self, index: int) -> str:
        return self.gpus[index].uuid

    def close(self) -> None:
        pynvml.nvmlShutdown()
        uninstall()
        self.sim.close()


@pytest.fixture
def node_of() -> Iterator[type[Node]]:
    made: list[Node] = []

    class Made(Node):
        def __init__(self, scenario: str) -> None:
            super().__init__(scenario)
            made.append(self)

    yield Made
    for node in made:
        node.close()


def test_a_pcie_box_reads_its_switches_sockets_and_cpus(node_of: type[Node]) -> None:
    node = node_of("gpus: [{model: L40S, count: 8}]")
    before = sum(node.sim.calls.values())
    topology = read_topology(node.gpus, node.calls_for, None)
    calls = sum(node.sim.calls.values()) - before
    assert calls == 28 * 2 + 8 * 2, "P2P and common ancestor per pair, two affinities per GPU"
    assert topology.path(node.uuid(0), node.uuid(1)) == PathKind.PCIE_SWITCH
    assert topology.path(node.uuid(0), node.uuid(2)) == PathKind.NUMA
    assert topology.path(node.uuid(0), node.uuid(5)) == PathKind.SYSTEM
    assert topology.numa_nodes[node.uuid(5)] == 1
    assert topology.local_cpus[node.uuid(0)] == frozenset(range(32)) | frozenset(range(64, 96))
    placed = placement(topology, [node.uuid(0), node.uuid(5)], [node.uuid(6), node.uuid(7)])
    assert (placed.path, placed.best) == (PathKind.SYSTEM, PathKind.PCIE_SWITCH)


def test_an_hgx_board_is_nvlink_everywhere_without_asking_pcie(node_of: type[Node]) -> None:
    node = node_of("gpus: [{model: H100-SXM-80GB, count: 8}]")
    topology = read_topology(node.gpus, node.calls_for, None)
    assert set(topology.paths.values()) == {PathKind.NVLINK}
    assert len(topology.paths) == 28
    assert node.sim.calls["nvmlDeviceGetTopologyCommonAncestor"] == 0


def test_a_gpu_whose_nvlinks_failed_falls_back_to_its_pcie_path(node_of: type[Node]) -> None:
    node = node_of("gpus: [{model: H100-SXM-80GB, count: 8}]")
    node.sim.inject({"type": "nvlink_down", "gpu": 3, "link": "all"})
    topology = read_topology(node.gpus, node.calls_for, None)
    assert topology.path(node.uuid(2), node.uuid(3)) == PathKind.NUMA
    placed = placement(topology, [node.uuid(2), node.uuid(3)], [node.uuid(4), node.uuid(5)])
    assert (placed.path, placed.best) == (PathKind.NUMA, PathKind.NVLINK), "could have had NVLink"


def test_sysfs_answers_where_nvml_has_no_affinity(node_of: type[Node], tmp_path: Path) -> None:
    node = node_of("gpus: [{model: L40S, count: 2}]")
    for function in ("nvmlDeviceGetCpuAffinityWithinScope", "nvmlDeviceGetMemoryAffinity"):
        node.sim.inject({"type": "nvml_error", "function": function, "error": "not_supported"})
    sysfs = write_pci_tree(node.sim, tmp_path)
    topology = read_topology(node.gpus, node.calls_for, sysfs)
    assert topology.numa_nodes[node.uuid(1)] == 0
    assert topology.local_cpus[node.uuid(1)] == frozenset(range(32)) | frozenset(range(64, 96))
    without = read_topology(node.gpus, node.calls_for, None)
    assert without.numa_nodes == {}, "unknown, not guessed"
    assert without.local_cpus == {}


def test_a_gpu_lost_during_the_read_leaves_its_pairs_unknown(node_of: type[Node]) -> None:
    node = node_of("gpus: [{model: L40S, count: 3}]")
    node.sim.inject({"type": "gpu_lost", "gpu": 2})
    topology = read_topology(node.gpus, node.calls_for, None)
    assert topology.path(node.uuid(0), node.uuid(1)) == PathKind.PCIE_SWITCH
    assert topology.path(node.uuid(0), node.uuid(2)) is None
    assert topology.weakest([node.uuid(0), node.uuid(2)]) is None
    assert node.uuid(2) not in topology.numa_nodes


@pytest.mark.parametrize(
    ("bus_id", "address"),
    [("00000000:18:00.0", "0000:18:00.0"), ("0000:AB:00.0", "0000:ab:00.0"), ("junk", None)],
)
def test_nvml_bus_ids_name_their_sysfs_device(bus_id: str, address: str | None) -> None:
    assert sysfs_address(bus_id) == address
