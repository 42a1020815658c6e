"""What the placement signals take from a real node (issue 36), asked directly and printed.

Per GPU: ``nvmlDeviceGetNumaNodeId`` (NotSupported expected off Grace), the CPU affinity (plain,
and within the NODE and SOCKET scopes), the memory affinity, and sysfs ``numa_node`` and
``local_cpulist`` of its PCI device, to see NVML and the kernel agree; the common ancestor and P2P
status of the GPU with itself (the simulator assumes INTERNAL and InvalidArgument) and of every
pair, per P2P index; a MIG device handle's answers where MIG is on; and what
``topology.read.read_topology`` makes of it all. A single GPU settles the per-GPU answers and the
self-pair; the pairs need a node with two or more.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pynvml

from gpu_exporter.devices import discover_gpu
from gpu_exporter.nvml import DeviceCalls, ErrorCounter, SupportRegistry
from gpu_exporter.topology.read import (
    CPU_WORDS,
    NODE_WORDS,
    read_sysfs_locality,
    read_topology,
    set_bits,
)

# pynvml's NVML_P2P_CAPS_INDEX_READ is the tuple (0,) (a stray comma), so the indexes are spelt.
P2P_INDEXES = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "pci": 4}
SYSFS = Path("/sys")


def _call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        return f"error: {exc}"


def _cpus(answer: Any) -> Any:
    """A mask as a compact list of CPU (or node) ids, or the error text."""
    if isinstance(answer, str):
        return answer
    members = sorted(set_bits(answer))
    return {"count": len(members), "first": members[:4], "last": members[-4:]}


def _pair(first: Any, second: Any) -> dict[str, Any]:
    answers = {"common_ancestor": _call(pynvml.nvmlDeviceGetTopologyCommonAncestor, first, second)}
    for name, index in P2P_INDEXES.items():
        answers[f"p2p_{name}"] = _call(pynvml.nvmlDeviceGetP2PStatus, first, second, index)
    return answers


def _gpu(handle: Any) -> dict[str, Any]:
    node, socket = pynvml.NVML_AFFINITY_SCOPE_NODE, pynvml.NVML_AFFINITY_SCOPE_SOCKET
    bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
    bus_id = bus.decode() if isinstance(bus, bytes) else str(bus)
    sys_node, sys_cpus = read_sysfs_locality(SYSFS, bus_id)
    return {
        "numa_node_id": _call(pynvml.nvmlDeviceGetNumaNodeId, handle),
        "cpu_affinity": _cpus(_call(pynvml.nvmlDeviceGetCpuAffinity, handle, CPU_WORDS)),
        "cpu_affinity_node": _cpus(
            _call(pynvml.nvmlDeviceGetCpuAffinityWithinScope, handle, CPU_WORDS, node)
        ),
        "cpu_affinity_socket": _cpus(
            _call(pynvml.nvmlDeviceGetCpuAffinityWithinScope, handle, CPU_WORDS, socket)
        ),
        "memory_affinity_node": _cpus(
            _call(pynvml.nvmlDeviceGetMemoryAffinity, handle, NODE_WORDS, node)
        ),
        "memory_affinity_socket": _cpus(
            _call(pynvml.nvmlDeviceGetMemoryAffinity, handle, NODE_WORDS, socket)
        ),
        "sysfs_numa_node": sys_node,
        "sysfs_local_cpus": None if sys_cpus is None else len(sys_cpus),
        "with_itself": _pair(handle, handle),
    }


def _mig(handle: Any) -> dict[str, Any] | str:
    try:
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    except pynvml.NVMLError as exc:
        return f"no MIG device: {exc}"
    return {
        "common_ancestor_with_parent": _call(
            pynvml.nvmlDeviceGetTopologyCommonAncestor, mig, handle
        ),
        "cpu_affinity": _cpus(_call(pynvml.nvmlDeviceGetCpuAffinity, mig, CPU_WORDS)),
        "numa_node_id": _call(pynvml.nvmlDeviceGetNumaNodeId, mig),
    }


def topology_probes(gpus: int) -> dict[str, Any]:
    """NVML already initialised by the caller (check.py's open_nvml)."""
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
    result: dict[str, Any] = {
        "gpus": {str(i): _gpu(h) for i, h in enumerate(handles)},
        "pairs": {
            f"{a}-{b}": _pair(handles[a], handles[b])
            for a, b in itertools.combinations(range(gpus), 2)
        },
        "mig": {str(i): _mig(h) for i, h in enumerate(handles)},
    }
    support, errors = SupportRegistry(), ErrorCounter()
    devices = [discover_gpu(i, support, errors).device for i in range(gpus)]
    topology = read_topology(
        devices, lambda d: DeviceCalls(d.uuid, support, errors, collector="topology"), SYSFS
    )
    index = {d.uuid: str(d.id.index) for d in devices}
    result["read_topology"] = {
        "paths": {
            "-".join(sorted(index[u] for u in pair)): path.label
            for pair, path in topology.paths.items()
        },
        "numa_nodes": {index[u]: n for u, n in topology.numa_nodes.items()},
        "local_cpus": {index[u]: len(c) for u, c in topology.local_cpus.items()},
    }
    return result
