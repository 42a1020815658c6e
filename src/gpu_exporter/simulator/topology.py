"""Where the simulated node's GPUs sit: NUMA nodes, CPUs, PCIe paths and NVLink pairs, read from
``data/topology.yaml`` (its header documents the layouts and where they come from)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import pynvml
import yaml

# nvmlGpuTopologyLevel_t, nearest first.
SINGLE: int = pynvml.NVML_TOPOLOGY_SINGLE
MULTIPLE: int = pynvml.NVML_TOPOLOGY_MULTIPLE
HOSTBRIDGE: int = pynvml.NVML_TOPOLOGY_HOSTBRIDGE
NODE: int = pynvml.NVML_TOPOLOGY_NODE
SYSTEM: int = pynvml.NVML_TOPOLOGY_SYSTEM
INTERNAL: int = pynvml.NVML_TOPOLOGY_INTERNAL


def parse_cpulist(text: str) -> frozenset[int]:
    """A Linux cpulist (``0-55,112-167``) as CPU ids; ValueError when it is not one."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        low, high = int(first), int(last or first)
        if low < 0 or high < low:
            raise ValueError(f"bad cpulist range {part!r}")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


@dataclass(frozen=True)
class Slot:
    """One GPU position of a layout."""

    numa_node: int
    pcie: tuple[str, ...]  # host bridge, then each PCIe switch down to the GPU
    gpu_memory_numa_node: int | None = None


@dataclass(frozen=True)
class Layout:
    name: str
    about: str
    cpulists: tuple[str, ...]  # per NUMA node, as sysfs node<N>/cpulist writes it
    numa_cpus: tuple[frozenset[int], ...]
    nvlink: str | frozenset[frozenset[int]]  # "all", "none", or slot pairs
    slots: tuple[Slot, ...]


@dataclass(frozen=True)
class Place:
    """Where one GPU of the node sits: its layout slot on its board."""

    slot: Slot
    index: int  # the slot's number
    board: int

    @property
    def numa_node(self) -> int:
        return self.slot.numa_node

    @property
    def pcie(self) -> tuple[str, ...]:
        return tuple(f"b{self.board}.{name}" for name in self.slot.pcie)


@dataclass(frozen=True)
class NodeTopology:
    """The node's topology: one :class:`Place` per GPU (by scenario index)."""

    layout: Layout
    places: tuple[Place, ...]

    @property
    def numa_nodes(self) -> int:
        return len(self.layout.numa_cpus)

    @property
    def cpus(self) -> frozenset[int]:
        return frozenset().union(*self.layout.numa_cpus)

    def numa_cpus(self, node: int) -> frozenset[int]:
        return self.layout.numa_cpus[node]

    def common_ancestor(self, a: int, b: int) -> int:
        """nvmlGpuTopologyLevel_t of GPUs ``a`` and ``b`` (INTERNAL for a GPU with itself)."""
        if a == b:
            return INTERNAL
        first, second = self.places[a], self.places[b]
        path_a, path_b = first.pcie, second.pcie
        shared = 0
        for x, y in zip(path_a, path_b, strict=False):
            if x != y:
                break
            shared += 1
        if shared >= 2:  # a switch in common: the direct parent of both, or one further up
            both_direct = shared == len(path_a) == len(path_b)
            return SINGLE if both_direct else MULTIPLE
        if shared == 1:
            return HOSTBRIDGE
        return NODE if first.numa_node == second.numa_node else SYSTEM

    def nvlink_joined(self, a: int, b: int) -> bool:
        """Whether the board joins GPUs ``a`` and ``b`` by NVLink (the links' state aside)."""
        first, second = self.places[a], self.places[b]
        if a == b or first.board != second.board:
            return False
        wiring = self.layout.nvlink
        if isinstance(wiring, str):
            return wiring == "all"
        return frozenset((first.index, second.index)) in wiring


def _slot(raw: Mapping[str, Any]) -> Slot:
    memory = raw.get("gpu_memory_numa_node")
    return Slot(
        int(raw["numa_node"]),
        tuple(str(name) for name in raw["pcie"]),
        None if memory is None else int(memory),
    )


def _layout(name: str, raw: Mapping[str, Any]) -> Layout:
    cpulists = tuple(str(text) for text in raw["numa_nodes"])
    wiring = raw["nvlink"]
    nvlink: str | frozenset[frozenset[int]] = (
        str(wiring)
        if isinstance(wiring, str)
        else frozenset(frozenset(int(g) for g in pair) for pair in wiring)
    )
    return Layout(
        name,
        " ".join(str(raw["about"]).split()),
        cpulists,
        tuple(parse_cpulist(text) for text in cpulists),
        nvlink,
        tuple(_slot(slot) for slot in raw["gpus"]),
    )


@cache
def _catalogue() -> tuple[Mapping[str, Layout], Mapping[str, str]]:
    text = resources.files("gpu_exporter.simulator").joinpath("data/topology.yaml").read_text()
    raw = yaml.safe_load(text)
    layouts = {name: _layout(name, spec) for name, spec in raw["layouts"].items()}
    return layouts, {str(model): str(layout) for model, layout in raw["models"].items()}


def layouts() -> Mapping[str, Layout]:
    """Every layout the data file describes, by name."""
    return _catalogue()[0]


def default_layout(model_key: str) -> str:
    """The layout a node whose first GPU is ``model_key`` gets without ``node.topology``."""
    return _catalogue()[1][model_key]


def node_topology(layout_name: str, gpu_count: int) -> NodeTopology:
    """The places of ``gpu_count`` GPUs on layout ``layout_name`` (boards repeat its slots)."""
    layout = layouts()[layout_name]
    slots: Sequence[Slot] = layout.slots
    places = tuple(
        Place(slots[i % len(slots)], i % len(slots), i // len(slots)) for i in range(gpu_count)
    )
    return NodeTopology(layout, places)
