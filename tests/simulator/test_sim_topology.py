"""Where GPUs sit, as the real pynvml reads it from the simulator: PCIe common ancestors, P2P over
NVLink, CPU and memory affinity, NUMA nodes, and the same facts in the simulated sysfs tree."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from gpu_exporter.simulator import ScenarioError, SimulatedNode, loads_scenario
from gpu_exporter.simulator.sysfs import write_pci_tree
from gpu_exporter.simulator.topology import layouts, parse_cpulist

from .sim_helpers import MakeNode

HGX = "gpus: [{model: H100-SXM-80GB, count: 8}]"
L40S = "gpus: [{model: L40S, count: 8}]"


def handles(count: int) -> list[object]:
    return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]


def ancestor(gpus: list[object], a: int, b: int) -> int:
    level: int = pynvml.nvmlDeviceGetTopologyCommonAncestor(gpus[a], gpus[b])
    return level


def nvlink(gpus: list[object], a: int, b: int) -> int:
    status: int = pynvml.nvmlDeviceGetP2PStatus(gpus[a], gpus[b], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
    return status


def cpus_of(words: object) -> set[int]:
    return {64 * i + bit for i, word in enumerate(words) for bit in range(64) if word >> bit & 1}  # type: ignore[attr-defined]


def test_every_pair_of_an_hgx_board_is_nvlink_and_the_sockets_split_it(
    make_node: MakeNode,
) -> None:
    make_node(HGX)
    gpus = handles(8)
    assert {nvlink(gpus, a, b) for a in range(8) for b in range(8) if a != b} == {
        pynvml.NVML_P2P_STATUS_OK
    }
    assert ancestor(gpus, 0, 3) == pynvml.NVML_TOPOLOGY_NODE, "one socket, own root ports"
    assert ancestor(gpus, 0, 4) == pynvml.NVML_TOPOLOGY_SYSTEM, "across sockets"
    # As nvidia-smi topo -m shows a DGX H100: GPU0-3 on 0-55,112-167, GPU4-7 on the other socket.
    assert cpus_of(pynvml.nvmlDeviceGetCpuAffinity(gpus[0], 4)) == parse_cpulist("0-55,112-167")
    assert cpus_of(pynvml.nvmlDeviceGetCpuAffinity(gpus[7], 4)) == parse_cpulist("56-111,168-223")
    scope = pynvml.NVML_AFFINITY_SCOPE_NODE
    assert list(pynvml.nvmlDeviceGetMemoryAffinity(gpus[5], 1, scope)) == [0b10]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNumaNodeId(gpus[0])  # x86: the GPU's memory is no NUMA node


def test_a_pcie_box_has_no_nvlink_and_answers_each_pcie_level(make_node: MakeNode) -> None:
    make_node(L40S)
    gpus = handles(8)
    assert nvlink(gpus, 0, 1) == pynvml.NVML_P2P_STATUS_GPU_NOT_SUPPORTED, "L40S has no NVLink"
    assert ancestor(gpus, 0, 1) == pynvml.NVML_TOPOLOGY_SINGLE, "one PCIe switch"
    assert ancestor(gpus, 0, 2) == pynvml.NVML_TOPOLOGY_NODE
    assert ancestor(gpus, 1, 6) == pynvml.NVML_TOPOLOGY_SYSTEM
    read = 0  # pynvml's NVML_P2P_CAPS_INDEX_READ is the tuple (0,): a stray comma in its source
    assert pynvml.nvmlDeviceGetP2PStatus(gpus[0], gpus[1], read) == pynvml.NVML_P2P_STATUS_OK
    assert (
        pynvml.nvmlDeviceGetP2PStatus(gpus[0], gpus[5], read)
        == pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED
    )
    nearest = pynvml.nvmlDeviceGetTopologyNearestGpus(gpus[0], pynvml.NVML_TOPOLOGY_SINGLE)
    assert [pynvml.nvmlDeviceGetIndex(h) for h in nearest] == [1]
    on_cpu_40 = pynvml.nvmlSystemGetTopologyGpuSet(40)  # socket 1 of this box
    assert [pynvml.nvmlDeviceGetIndex(h) for h in on_cpu_40] == [4, 5, 6, 7]


def test_cascaded_switches_and_root_ports_give_multiple_and_hostbridge(
    make_node: MakeNode,
) -> None:
    make_node("node: {topology: pcie-cascade-8gpu}\n" + L40S)
    gpus = handles(8)
    assert ancestor(gpus, 0, 2) == pynvml.NVML_TOPOLOGY_MULTIPLE, "two leaves of one top switch"
    assert ancestor(gpus, 0, 0) == pynvml.NVML_TOPOLOGY_INTERNAL


def test_root_ports_of_one_host_bridge(make_node: MakeNode) -> None:
    make_node("node: {topology: pcie-direct-4gpu}\ngpus: [{model: L40S, count: 4}]")
    gpus = handles(4)
    assert ancestor(gpus, 0, 1) == pynvml.NVML_TOPOLOGY_HOSTBRIDGE
    assert ancestor(gpus, 0, 2) == pynvml.NVML_TOPOLOGY_NODE
    assert ancestor(gpus, 0, 3) == pynvml.NVML_TOPOLOGY_SYSTEM


def test_a_cube_mesh_joins_some_pairs_and_not_others(make_node: MakeNode) -> None:
    make_node("gpus: [{model: V100-SXM2-32GB, count: 8}]")
    gpus = handles(8)
    assert nvlink(gpus, 0, 4) == pynvml.NVML_P2P_STATUS_OK
    assert nvlink(gpus, 0, 5) == pynvml.NVML_P2P_STATUS_NOT_SUPPORTED, "no link in the mesh"


def test_a_gpu_with_every_nvlink_down_loses_its_nvlink_paths(make_node: MakeNode) -> None:
    node = make_node(HGX)
    gpus = handles(8)
    node.inject({"type": "nvlink_down", "gpu": 3, "link": [0, 1]})
    assert nvlink(gpus, 2, 3) == pynvml.NVML_P2P_STATUS_OK, "a partly failed GPU still reaches"
    node.inject({"type": "nvlink_down", "gpu": 3, "link": "all"})
    assert nvlink(gpus, 2, 3) == pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
    assert nvlink(gpus, 2, 4) == pynvml.NVML_P2P_STATUS_OK


def test_grace_systems_answer_the_gpu_memory_numa_node(make_node: MakeNode) -> None:
    make_node("gpus: [{model: GB200-NVL72, count: 4}]")
    gpus = handles(4)
    assert [pynvml.nvmlDeviceGetNumaNodeId(h) for h in gpus] == [2, 3, 4, 5]
    assert cpus_of(pynvml.nvmlDeviceGetCpuAffinity(gpus[2], 4)) == set(range(72, 144))


def test_mig_handles_and_bad_arguments_get_what_drivers_give(make_node: MakeNode) -> None:
    make_node("gpus: [{model: H100-SXM-80GB, count: 2, mig: [3g.40gb]}]")
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    other = pynvml.nvmlDeviceGetHandleByIndex(1)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTopologyCommonAncestor(mig, other)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetCpuAffinity(mig, 4)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetP2PStatus(gpu, gpu, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetP2PStatus(gpu, other, 9)


def test_a_lost_gpu_answers_gpu_is_lost(make_node: MakeNode) -> None:
    node = make_node(HGX)
    gpus = handles(2)
    node.inject({"type": "gpu_lost", "gpu": 1})
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetTopologyCommonAncestor(gpus[0], gpus[1])


def test_sysfs_gives_each_gpu_its_numa_node_and_local_cpus(tmp_path: Path) -> None:
    node = SimulatedNode(loads_scenario(L40S, "t.yaml"))
    try:
        root = write_pci_tree(node, tmp_path)
    finally:
        node.close()
    gpu5 = root / "bus" / "pci" / "devices" / f"0000:{node.gpus[5].bus:02x}:00.0"
    assert (gpu5 / "numa_node").read_text() == "1\n"
    assert (gpu5 / "local_cpulist").read_text() == "32-63,96-127\n"
    nodes = root / "devices" / "system" / "node"
    assert (nodes / "node0" / "cpulist").read_text() == "0-31,64-95\n"
    assert sorted(p.name for p in nodes.iterdir()) == ["node0", "node1"]


def test_scenario_keys_name_the_layout_and_the_kubelet_cpus() -> None:
    scenario = loads_scenario(
        """
        node: {topology: pcie-switch-8gpu}
        gpus: [{model: L40S, count: 2}]
        allocations:
          - {gpu: 0, pod: loader, cpu_ids: "0-3,64", memory_numa_nodes: [0]}
          - {gpu: 1, pod: loader}
        """,
        "t.yaml",
    )
    assert scenario.node.topology == "pcie-switch-8gpu"
    assert scenario.allocations[0].cpu_ids == (0, 1, 2, 3, 64)
    assert scenario.allocations[0].memory_numa_nodes == (0,)
    assert scenario.allocations[1].cpu_ids == ()
    assert loads_scenario(HGX, "t.yaml").node.topology == "hgx-8gpu", "the model's default"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node: {topology: dgx2}\n" + L40S, "t.yaml: node.topology: expected one of"),
        (
            L40S + "\nallocations: [{gpu: 0, pod: a, cpu_ids: [128]}]",
            "t.yaml: allocations[0].cpu_ids: CPU 128 is not on the node"
            " (topology pcie-switch-8gpu has CPUs 0-127)",
        ),
        (
            L40S + "\nallocations: [{gpu: 0, pod: a, cpu_ids: 0-x}]",
            "t.yaml: allocations[0].cpu_ids: '0-x' is not a cpulist such as 0-3,8",
        ),
        (
            L40S + "\nallocations: [{gpu: 0, pod: a, cpu_ids: [1, -1]}]",
            "t.yaml: allocations[0].cpu_ids[1]: must be >= 0, got -1",
        ),
        (
            L40S + "\nallocations: [{gpu: 0, pod: a, memory_numa_nodes: [2]}]",
            "t.yaml: allocations[0].memory_numa_nodes: NUMA node 2 is not on the node",
        ),
        (
            L40S
            + "\nallocations: [{gpu: 0, pod: a, cpu_ids: [1]}, {gpu: 1, pod: a, cpu_ids: [2]}]",
            "t.yaml: allocations[1].cpu_ids: container default/a/main already lists other"
            " cpu_ids at allocations[0]: give them once",
        ),
    ],
)
def test_bad_topology_keys_say_what_and_where(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as error:
        loads_scenario(text, "t.yaml")
    assert str(error.value).startswith(message)


def test_every_layout_is_coherent() -> None:
    for name, layout in layouts().items():
        cpus = [c for node in layout.numa_cpus for c in node]
        assert len(cpus) == len(set(cpus)), f"{name}: a CPU on two NUMA nodes"
        assert layout.about, f"{name}: no source"
        for slot in layout.slots:
            assert 0 <= slot.numa_node < len(layout.numa_cpus), f"{name}: bad numa_node"
            assert slot.pcie, f"{name}: a GPU without a host bridge"
        if not isinstance(layout.nvlink, str):
            assert all(max(pair) < len(layout.slots) for pair in layout.nvlink), name
        else:
            assert layout.nvlink in ("all", "none"), name
