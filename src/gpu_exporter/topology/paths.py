"""Paths between GPUs and what a placement made of them (pure: no NVML, no I/O).

A pair of GPUs talks over NVLink where NVML's P2P status for the NVLink index is OK, else over
PCIe as far up as their common ancestor (``nvmlGpuTopologyLevel_t``). A set of GPUs is as fast as
its weakest pair: a tensor-parallel all-reduce waits for the slowest link. The best path a node
offered for the same number of GPUs, among the GPUs that were free and the pod's own, says
whether a better placement existed ("could have had NVLink").
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeVar

import pynvml


class PathKind(IntEnum):
    """How two GPUs reach each other, strongest first (the order compares them)."""

    NVLINK = 0
    PCIE_SWITCH = 1  # through PCIe switches only (same switch, or switches below one)
    PCIE_HOST_BRIDGE = 2  # through a PCIe host bridge (the CPU's root complex)
    NUMA = 3  # across host bridges of one NUMA node
    SYSTEM = 4  # across NUMA nodes (the sockets' interconnect)

    @property
    def label(self) -> str:
        """The series label value: ``nvlink``, ``pcie_switch``, ... ."""
        return self.name.lower()


# nvmlGpuTopologyLevel_t -> the path a pair without NVLink takes. INTERNAL is a board with two
# GPUs behind its own switch (a K80); a level NVML adds later is unknown, not guessed.
_PCIE_LEVELS: Mapping[int, PathKind] = {
    pynvml.NVML_TOPOLOGY_INTERNAL: PathKind.PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_SINGLE: PathKind.PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_MULTIPLE: PathKind.PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: PathKind.PCIE_HOST_BRIDGE,
    pynvml.NVML_TOPOLOGY_NODE: PathKind.NUMA,
    pynvml.NVML_TOPOLOGY_SYSTEM: PathKind.SYSTEM,
}


def pair_path(nvlink: bool, common_ancestor: int | None) -> PathKind | None:
    """The path of one pair: NVLink where P2P over NVLink is OK, else its PCIe level; None when
    neither is known (a call unsupported, a GPU lost mid-read, an unknown level)."""
    if nvlink:
        return PathKind.NVLINK
    if common_ancestor is None:
        return None
    return _PCIE_LEVELS.get(common_ancestor)


def pair(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


@dataclass(frozen=True)
class Topology:
    """What the node's whole GPUs (by UUID) know of each other and of the CPUs, read at once.

    ``paths``: each pair's path (a pair absent: unknown). ``numa_nodes``: each GPU's NUMA node;
    ``local_cpus``: the CPUs of that node (a GPU absent from either: unknown).
    """

    paths: Mapping[frozenset[str], PathKind]
    numa_nodes: Mapping[str, int]
    local_cpus: Mapping[str, frozenset[int]]

    def path(self, a: str, b: str) -> PathKind | None:
        return self.paths.get(pair(a, b))

    def weakest(self, gpus: Collection[str]) -> PathKind | None:
        """The weakest path between any two of ``gpus``; None for fewer than two distinct GPUs
        or when any pair's path is unknown (a guess would be worse than nothing)."""
        distinct = sorted(set(gpus))
        if len(distinct) < 2:
            return None
        weakest = PathKind.NVLINK
        for a, b in itertools.combinations(distinct, 2):
            found = self.path(a, b)
            if found is None:
                return None
            weakest = max(weakest, found)
        return weakest

    def best(self, count: int, candidates: Collection[str]) -> PathKind | None:
        """The best weakest-path any ``count`` of ``candidates`` would have had; None for a
        count below two or above the candidates, or when no set's paths are all known."""
        distinct = sorted(set(candidates))
        if not 2 <= count <= len(distinct):
            return None
        for level in PathKind:
            if _has_clique(distinct, count, self._joined_within(level)):
                return level
        return None

    def _joined_within(self, level: PathKind) -> Callable[[str, str], bool]:
        def joined(a: str, b: str) -> bool:
            found = self.path(a, b)
            return found is not None and found <= level

        return joined


def _has_clique(nodes: list[str], size: int, joined: Callable[[str, str], bool]) -> bool:
    """Whether ``size`` of ``nodes`` are pairwise ``joined``: a backtracking search that drops a
    branch as soon as too few candidates remain. Paths through switches and sockets group GPUs
    into disjoint cliques, so the search ends fast; NVLink meshes are small (a board)."""

    def extend(chosen: int, candidates: list[str]) -> bool:
        if chosen == size:
            return True
        for i, node in enumerate(candidates):
            if chosen + len(candidates) - i < size:
                return False
            rest = [other for other in candidates[i + 1 :] if joined(node, other)]
            if extend(chosen + 1, rest):
                return True
        return False

    return extend(0, nodes)


@dataclass(frozen=True)
class Placement:
    """A pod's GPUs on the node: their weakest path, and the best the node had for as many."""

    path: PathKind | None
    best: PathKind | None

    @property
    def could_have_been_better(self) -> bool:
        return self.path is not None and self.best is not None and self.best < self.path


def placement(topology: Topology, held: Collection[str], free: Iterable[str]) -> Placement:
    """The placement of a pod holding ``held`` (whole-GPU UUIDs; a MIG instance counts as its
    GPU) when ``free`` GPUs were unheld: the best is sought among the free and the pod's own."""
    own = set(held)
    return Placement(topology.weakest(own), topology.best(len(own), own | set(free)))


Holder = TypeVar("Holder")


def placements(
    topology: Topology, holdings: Mapping[Holder, Collection[str]], gpus: Collection[str]
) -> dict[Holder, Placement]:
    """Every holder's placement on a node of ``gpus`` (whole-GPU UUIDs), where ``holdings`` is
    what each holder (a pod) holds: the GPUs no holder holds are the free ones."""
    held = set().union(*holdings.values()) if holdings else set()
    free = set(gpus) - held
    return {holder: placement(topology, own, free) for holder, own in holdings.items()}


def numa_aligned_ratio(cpu_ids: Collection[int], local_cpus: frozenset[int] | None) -> float | None:
    """The fraction of a container's CPUs on its GPU's NUMA node; None (absent, not zero) when
    the kubelet lists no CPU ids (no static CPU manager) or the GPU's CPUs are unknown."""
    cpus = set(cpu_ids)
    if not cpus or local_cpus is None:
        return None
    return len(cpus & local_cpus) / len(cpus)


def memory_aligned_ratio(memory_nodes: Collection[int], gpu_node: int | None) -> float | None:
    """The fraction of a container's memory NUMA nodes (the memory manager's) that are its GPU's
    node; None when the kubelet lists none or the GPU's node is unknown."""
    nodes = set(memory_nodes)
    if not nodes or gpu_node is None:
        return None
    return (gpu_node in nodes) / len(nodes)
