"""The weakest path of a pod's GPUs, the best the node offered, and NUMA alignment."""

from __future__ import annotations

import itertools

import pynvml
import pytest

from gpu_exporter.topology.paths import (
    PathKind,
    Topology,
    memory_aligned_ratio,
    numa_aligned_ratio,
    pair,
    pair_path,
    placement,
    placements,
)


@pytest.mark.parametrize(
    ("nvlink", "level", "expected"),
    [
        (True, None, "nvlink"),
        (True, pynvml.NVML_TOPOLOGY_SYSTEM, "nvlink"),  # NVLink wins over any PCIe level
        (False, pynvml.NVML_TOPOLOGY_INTERNAL, "pcie_switch"),
        (False, pynvml.NVML_TOPOLOGY_SINGLE, "pcie_switch"),
        (False, pynvml.NVML_TOPOLOGY_MULTIPLE, "pcie_switch"),
        (False, pynvml.NVML_TOPOLOGY_HOSTBRIDGE, "pcie_host_bridge"),
        (False, pynvml.NVML_TOPOLOGY_NODE, "numa"),
        (False, pynvml.NVML_TOPOLOGY_SYSTEM, "system"),
    ],
)
def test_each_nvml_answer_names_one_path(nvlink: bool, level: int | None, expected: str) -> None:
    found = pair_path(nvlink, level)
    assert found is not None
    assert found.label == expected


def test_a_pair_nvml_cannot_place_has_no_path_rather_than_a_guess() -> None:
    assert pair_path(False, None) is None, "common ancestor unsupported"
    assert pair_path(False, 60) is None, "a level NVML may add later"


def matrix(levels: dict[tuple[int, int], PathKind], gpus: int) -> Topology:
    paths = {
        pair(f"g{a}", f"g{b}"): levels[(a, b)] for a, b in itertools.combinations(range(gpus), 2)
    }
    return Topology(paths, {}, {})


def pcie_box() -> Topology:
    """Eight PCIe GPUs: pairs under one switch, two switches per socket (the L40S layout)."""
    levels = {}
    for a, b in itertools.combinations(range(8), 2):
        if a // 2 == b // 2:
            levels[(a, b)] = PathKind.PCIE_SWITCH
        elif a // 4 == b // 4:
            levels[(a, b)] = PathKind.NUMA
        else:
            levels[(a, b)] = PathKind.SYSTEM
    return matrix(levels, 8)


def test_the_weakest_pair_decides_a_sets_path() -> None:
    box = pcie_box()
    assert box.weakest(["g0", "g1"]) == PathKind.PCIE_SWITCH
    assert box.weakest(["g0", "g1", "g2"]) == PathKind.NUMA
    assert box.weakest(["g0", "g1", "g5"]) == PathKind.SYSTEM


def test_one_gpu_has_no_path_and_two_slices_of_one_gpu_are_one_gpu() -> None:
    box = pcie_box()
    assert box.weakest(["g3"]) is None
    assert box.weakest(["g3", "g3"]) is None


def test_an_unknown_pair_leaves_the_sets_path_unknown() -> None:
    box = pcie_box()
    holes = Topology({k: v for k, v in box.paths.items() if k != pair("g0", "g1")}, {}, {})
    assert holes.weakest(["g0", "g1", "g2"]) is None
    assert holes.weakest(["g2", "g3"]) == PathKind.PCIE_SWITCH


def test_a_pod_split_across_sockets_could_have_had_one_switch() -> None:
    box = pcie_box()
    # The pod holds GPUs 0 and 5; 1..4 are held by others; 6 and 7 are free (one switch).
    placed = placement(box, held=["g0", "g5"], free=["g6", "g7"])
    assert placed.path == PathKind.SYSTEM
    assert placed.best == PathKind.PCIE_SWITCH
    assert placed.could_have_been_better


def test_the_best_counts_the_pods_own_gpus_as_free() -> None:
    box = pcie_box()
    placed = placement(box, held=["g0", "g1"], free=[])
    assert placed.path == placed.best == PathKind.PCIE_SWITCH
    assert not placed.could_have_been_better, "a good placement stays quiet"


def test_on_a_full_node_the_placement_is_the_best_there_was() -> None:
    box = pcie_box()
    placed = placement(box, held=["g0", "g5"], free=[])
    assert placed.path == placed.best == PathKind.SYSTEM
    assert not placed.could_have_been_better


def test_four_gpus_find_the_socket_that_has_them() -> None:
    box = pcie_box()
    placed = placement(box, held=["g0", "g1", "g4", "g5"], free=["g2", "g3"])
    assert placed.path == PathKind.SYSTEM
    assert placed.best == PathKind.NUMA, "g0-g3 on one socket"


def test_could_have_had_nvlink_on_a_mesh_with_some_pairs_unjoined() -> None:
    # A DGX-1 cube mesh: 0-3 and 4-7 fully joined, and i with i+4; the rest over PCIe.
    joined = {frozenset(p) for p in itertools.combinations(range(4), 2)}
    joined |= {frozenset(p) for p in itertools.combinations(range(4, 8), 2)}
    joined |= {frozenset((i, i + 4)) for i in range(4)}
    levels = {
        (a, b): PathKind.NVLINK if frozenset((a, b)) in joined else PathKind.SYSTEM
        for a, b in itertools.combinations(range(8), 2)
    }
    mesh = matrix(levels, 8)
    placed = placement(mesh, held=["g0", "g5"], free=["g1", "g2"])
    assert placed.path == PathKind.SYSTEM
    assert placed.best == PathKind.NVLINK, "g0 with g1 or g2 had NVLink"
    assert mesh.best(5, [f"g{i}" for i in range(8)]) == PathKind.SYSTEM, "no 5 pairwise joined"
    assert mesh.best(4, [f"g{i}" for i in range(8)]) == PathKind.NVLINK


def test_a_large_node_finds_its_best_set_without_trying_every_subset() -> None:
    # 64 GPUs on 8 boards of 8 (NVLink within a board, across boards the system): the best
    # 8 of 64 is one board; 4.4e9 subsets would never finish.
    levels = {
        (a, b): PathKind.NVLINK if a // 8 == b // 8 else PathKind.SYSTEM
        for a, b in itertools.combinations(range(64), 2)
    }
    node = matrix(levels, 64)
    everything = [f"g{i}" for i in range(64)]
    assert node.best(8, everything) == PathKind.NVLINK
    assert node.best(9, everything) == PathKind.SYSTEM


def test_every_holders_placement_counts_the_gpus_nobody_holds_as_free() -> None:
    box = pcie_box()
    node = [f"g{i}" for i in range(8)]
    holdings = {"split": ["g0", "g5"], "pair": ["g2", "g3"], "one": ["g1"], "big": ["g4"]}
    placed = placements(box, holdings, node)
    assert placed["split"].best == PathKind.PCIE_SWITCH, "g6 and g7 were free"
    assert not placed["pair"].could_have_been_better
    assert placed["one"].path is None
    full = placements(box, {**holdings, "rest": ["g6", "g7"]}, node)
    assert full["split"].best == PathKind.SYSTEM, "nothing free: its own pair was the best"


def test_best_needs_two_gpus_and_enough_candidates() -> None:
    box = pcie_box()
    assert box.best(1, ["g0", "g1"]) is None
    assert box.best(3, ["g0", "g1"]) is None


def test_numa_alignment_is_the_share_of_the_containers_cpus_on_the_gpus_node() -> None:
    socket0 = frozenset(range(0, 32)) | frozenset(range(64, 96))
    assert numa_aligned_ratio([0, 1, 2, 3], socket0) == 1.0
    assert numa_aligned_ratio([32, 33, 34, 35], socket0) == 0.0, "all on the far socket"
    assert numa_aligned_ratio([30, 31, 32, 33], socket0) == 0.5
    assert numa_aligned_ratio([], socket0) is None, "no CPU ids: absent, not zero"
    assert numa_aligned_ratio([1], None) is None, "the GPU's CPUs unknown"


def test_memory_alignment_is_the_share_of_memory_nodes_that_are_the_gpus() -> None:
    assert memory_aligned_ratio([0], 0) == 1.0
    assert memory_aligned_ratio([1], 0) == 0.0
    assert memory_aligned_ratio([0, 1], 1) == 0.5
    assert memory_aligned_ratio([], 0) is None
    assert memory_aligned_ratio([0], None) is None
