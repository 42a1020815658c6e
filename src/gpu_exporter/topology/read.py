"""Reading the node's topology through NVML (blocking: call it on a worker thread), once per
allocation change: the paths between GPUs do not change while a pod runs, and reading them costs
one or two calls per pair (docs/performance.md).

Per pair: ``nvmlDeviceGetP2PStatus`` with the NVLink index; where that is not OK,
``nvmlDeviceGetTopologyCommonAncestor``. Per GPU: the CPUs and NUMA node of its locality from
``nvmlDeviceGetCpuAffinityWithinScope`` and ``nvmlDeviceGetMemoryAffinity`` (scope NODE), else
from sysfs (``numa_node`` and ``local_cpulist`` of its PCI device), which answers on drivers or
platforms where NVML does not. ``nvmlDeviceGetNumaNodeId`` is not the one: it names the GPU's own
memory node, and only where the GPU's memory is a NUMA node (Grace), never the CPUs' node.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pynvml

from ..devices import Device
from ..logs import get_logger
from ..nvml import DeviceCalls, DeviceLost
from .paths import PathKind, Topology, pair, pair_path

_log = get_logger("topology")
# Mask sizes in 64-bit words: Linux's NR_CPUS (8192) on distribution kernels, and its NUMA nodes
# (MAX_NUMNODES, 1024): large enough for any host, a few hundred bytes per call.
CPU_WORDS = 8192 // 64
NODE_WORDS = 1024 // 64
WORD_BITS = 64
NVLINK_INDEX: int = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
P2P_OK: int = pynvml.NVML_P2P_STATUS_OK
SCOPE_NODE: int = pynvml.NVML_AFFINITY_SCOPE_NODE


def read_topology(
    gpus: Sequence[Device], calls_for: Callable[[Device], DeviceCalls], sysfs: Path | None
) -> Topology:
    """The paths between whole GPUs ``gpus`` and each one's NUMA node and local CPUs.

    ``calls_for(device)`` gives the calls a read of ``device`` goes through (pairwise calls go
    through the first GPU's). A GPU lost during the read leaves its pairs unknown."""
    paths: dict[frozenset[str], PathKind] = {}
    for first, second in itertools.combinations(gpus, 2):
        try:
            found = _pair_path(calls_for(first), first, second)
        except DeviceLost:
            continue
        if found is not None:
            paths[pair(first.uuid, second.uuid)] = found
    numa_nodes: dict[str, int] = {}
    local_cpus: dict[str, frozenset[int]] = {}
    for gpu in gpus:
        try:
            node, cpus = _locality(calls_for(gpu), gpu, sysfs)
        except DeviceLost:
            continue
        if node is not None:
            numa_nodes[gpu.uuid] = node
        if cpus is not None:
            local_cpus[gpu.uuid] = cpus
    return Topology(paths, numa_nodes, local_cpus)


def _pair_path(calls: DeviceCalls, first: Device, second: Device) -> PathKind | None:
    status: Any = calls.get(
        pynvml.nvmlDeviceGetP2PStatus, first.handle, second.handle, NVLINK_INDEX
    )
    if status is not None and int(status) == P2P_OK:
        return PathKind.NVLINK
    level: Any = calls.get(pynvml.nvmlDeviceGetTopologyCommonAncestor, first.handle, second.handle)
    return pair_path(False, None if level is None else int(level))


def _locality(
    calls: DeviceCalls, gpu: Device, sysfs: Path | None
) -> tuple[int | None, frozenset[int] | None]:
    cpu_words: Any = calls.get(
        pynvml.nvmlDeviceGetCpuAffinityWithinScope, gpu.handle, CPU_WORDS, SCOPE_NODE
    )
    node_words: Any = calls.get(
        pynvml.nvmlDeviceGetMemoryAffinity, gpu.handle, NODE_WORDS, SCOPE_NODE
    )
    cpus = frozenset(set_bits(cpu_words)) if cpu_words is not None else None
    nodes = sorted(set_bits(node_words)) if node_words is not None else []
    node = nodes[0] if len(nodes) == 1 else None
    if (cpus is None or node is None) and sysfs is not None:
        sys_node, sys_cpus = read_sysfs_locality(sysfs, gpu.id.pci_bus_id)
        node = sys_node if node is None else node
        cpus = sys_cpus if cpus is None else cpus
    return node, cpus


def set_bits(words: Iterable[int]) -> Iterable[int]:
    """The members of an NVML affinity mask (64-bit words, lowest bit first)."""
    for index, word in enumerate(words):
        value = int(word)
        bit = 0
        while value:
            if value & 1:
                yield index * WORD_BITS + bit
            value >>= 1
            bit += 1


def sysfs_address(bus_id: str) -> str | None:
    """NVML's ``00000000:18:00.0`` as sysfs names it (``0000:18:00.0``); None if malformed."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}" if rest else None
    except ValueError:
        return None


def read_sysfs_locality(sysfs: Path, bus_id: str) -> tuple[int | None, frozenset[int] | None]:
    """The NUMA node (None where the kernel says -1: no locality known) and local CPUs of the PCI
    device ``bus_id`` under ``sysfs``; (None, None) when they cannot be read."""
    address = sysfs_address(bus_id)
    if address is None:
        return None, None
    entry = sysfs / "bus" / "pci" / "devices" / address
    try:
        node = int((entry / "numa_node").read_text())
        cpus = parse_cpulist((entry / "local_cpulist").read_text())
    except (OSError, ValueError) as exc:
        _log.info("no NUMA locality in sysfs", path=str(entry), error=str(exc))
        return None, None
    return (node if node >= 0 else None), cpus


def parse_cpulist(text: str) -> frozenset[int]:
    """A Linux cpulist (``0-55,112-167``); ValueError when it is not one."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"range {part!r} runs backwards")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)
