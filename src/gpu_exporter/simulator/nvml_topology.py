"""Fake NVML: where GPUs sit: PCIe common ancestors, P2P capabilities, CPU and memory affinity.

From the node's layout (``topology.py``, ``data/topology.yaml``). What real drivers answer and
what is assumed:

- ``nvmlDeviceGetTopologyCommonAncestor``: SINGLE/MULTIPLE/HOSTBRIDGE/NODE/SYSTEM from the PCIe
  paths and NUMA nodes; a GPU with itself answers INTERNAL (assumed).
- ``nvmlDeviceGetP2PStatus``: NVLINK is OK where the board joins the pair and each GPU has a link
  up (a GPU with every link down has no NVLink path, assumed to show at once); a model without
  NVLink answers GPU_NOT_SUPPORTED, a pair the board does not join NOT_SUPPORTED (the codes
  assumed). READ, WRITE and PCI are OK over NVLink, or over PCIe within a NUMA node; across
  sockets IOH_TOPOLOGY_NOT_SUPPORTED. ATOMICS only over NVLink. A GPU with itself, or an index
  past NVML_P2P_CAPS_INDEX_UNKNOWN, is an invalid argument.
- Affinity (``nvmlDeviceGetCpuAffinity``, ``...WithinScope``, ``nvmlDeviceGetMemoryAffinity``):
  the CPUs (node set) of the GPU's NUMA node, as 64-bit words filled up to the caller's size;
  the layouts have one NUMA node per socket, so NODE and SOCKET scopes agree.
- ``nvmlDeviceGetNumaNodeId``: NotSupported unless the GPU's memory is a NUMA node of its own
  (coherent Grace systems: nvml.h "only applies to platforms where the GPUs are NUMA nodes").

MIG device handles answer NotSupported, as for every whole-GPU query here (``FunctionsBase.gpu``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

import pynvml

from gpu_exporter.simulator.devices import GpuDevice
from gpu_exporter.simulator.errors import NvmlFailure
from gpu_exporter.simulator.nvml_base import (
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    FunctionsBase,
    out,
    val,
)

WORD_BITS = 64  # nvmlDeviceGetCpuAffinity's words are unsigned long: 64 bits on Linux x86_64/arm64
P2P_OK: int = pynvml.NVML_P2P_STATUS_OK
P2P_GPU_NOT_SUPPORTED: int = pynvml.NVML_P2P_STATUS_GPU_NOT_SUPPORTED
P2P_IOH_TOPOLOGY_NOT_SUPPORTED: int = pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED
P2P_NOT_SUPPORTED: int = pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
P2P_UNKNOWN: int = pynvml.NVML_P2P_STATUS_UNKNOWN
NVLINK_INDEX: int = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
ATOMICS_INDEX: int = pynvml.NVML_P2P_CAPS_INDEX_ATOMICS
UNKNOWN_INDEX: int = pynvml.NVML_P2P_CAPS_INDEX_UNKNOWN
AFFINITY_SCOPES = (pynvml.NVML_AFFINITY_SCOPE_NODE, pynvml.NVML_AFFINITY_SCOPE_SOCKET)


class TopologyFunctions(FunctionsBase):
    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any, level: Any) -> int:
        first, second = self.gpu(device1), self.gpu(device2)
        out(level).value = self.node.topology.common_ancestor(first.index, second.index)
        return SUCCESS

    def nvmlDeviceGetP2PStatus(self, device1: Any, device2: Any, index: Any, status: Any) -> int:
        first, second = self.gpu(device1), self.gpu(device2)
        caps = int(val(index))
        if first is second or not 0 <= caps <= UNKNOWN_INDEX:
            raise NvmlFailure(INVALID_ARGUMENT)
        out(status).value = self._p2p(first, second, caps)
        return SUCCESS

    def _p2p(self, first: GpuDevice, second: GpuDevice, caps: int) -> int:
        nvlink = self._nvlink(first, second)
        if caps == NVLINK_INDEX:
            return nvlink
        if caps == UNKNOWN_INDEX:
            return P2P_UNKNOWN
        if nvlink == P2P_OK:
            return P2P_OK
        if caps == ATOMICS_INDEX:
            return P2P_NOT_SUPPORTED
        level = self.node.topology.common_ancestor(first.index, second.index)
        if level >= pynvml.NVML_TOPOLOGY_SYSTEM:
            return P2P_IOH_TOPOLOGY_NOT_SUPPORTED
        return P2P_OK

    def _nvlink(self, first: GpuDevice, second: GpuDevice) -> int:
        if first.model.nvlink is None or second.model.nvlink is None:
            return P2P_GPU_NOT_SUPPORTED
        joined = self.node.topology.nvlink_joined(first.index, second.index)
        up = all(any(link.active for link in gpu.links.nvlinks) for gpu in (first, second))
        return P2P_OK if joined and up else P2P_NOT_SUPPORTED

    def nvmlDeviceGetNumaNodeId(self, handle: Any, node: Any) -> int:
        place = self.node.topology.places[self.gpu(handle).index]
        if place.slot.gpu_memory_numa_node is None:
            raise NvmlFailure(NOT_SUPPORTED)
        out(node).value = place.slot.gpu_memory_numa_node
        return SUCCESS

    def nvmlDeviceGetCpuAffinity(self, handle: Any, size: Any, cpu_set: Any) -> int:
        return self.nvmlDeviceGetCpuAffinityWithinScope(
            handle, size, cpu_set, pynvml.NVML_AFFINITY_SCOPE_NODE
        )

    def nvmlDeviceGetCpuAffinityWithinScope(
        self, handle: Any, size: Any, cpu_set: Any, scope: Any
    ) -> int:
        topology = self.node.topology
        gpu = self.gpu(handle)
        _scope(scope)
        _fill(cpu_set, size, topology.numa_cpus(topology.places[gpu.index].numa_node))
        return SUCCESS

    def nvmlDeviceGetMemoryAffinity(self, handle: Any, size: Any, node_set: Any, scope: Any) -> int:
        gpu = self.gpu(handle)
        _scope(scope)
        _fill(node_set, size, (self.node.topology.places[gpu.index].numa_node,))
        return SUCCESS

    def nvmlDeviceGetTopologyNearestGpus(
        self, handle: Any, level: Any, count: Any, devices: Any
    ) -> int:
        gpu = self.gpu(handle)
        limit = int(val(level))
        topology = self.node.topology
        nearest = [
            other
            for other in self.node.visible_gpus
            if other is not gpu and topology.common_ancestor(gpu.index, other.index) <= limit
        ]
        return _answer_gpus(nearest, count, devices)

    def nvmlSystemGetTopologyGpuSet(self, cpu: Any, count: Any, devices: Any) -> int:
        number = int(val(cpu))
        topology = self.node.topology
        if number not in topology.cpus:
            raise NvmlFailure(INVALID_ARGUMENT)
        near = [
            gpu
            for gpu in self.node.visible_gpus
            if number in topology.numa_cpus(topology.places[gpu.index].numa_node)
        ]
        return _answer_gpus(near, count, devices)


def _scope(scope: Any) -> None:
    if int(val(scope)) not in AFFINITY_SCOPES:
        raise NvmlFailure(INVALID_ARGUMENT)


def _fill(words: Any, size: Any, members: Iterable[int]) -> None:
    """Set each member's bit in the caller's array of ``size`` 64-bit words (those past the array
    are left out, as a too-small buffer gets only what fits)."""
    array = out(words)
    length = int(val(size))
    if length <= 0:
        raise NvmlFailure(INVALID_ARGUMENT)
    values = [0] * length
    for member in members:
        word, bit = divmod(member, WORD_BITS)
        if word < length:
            values[word] |= 1 << bit
    for i, value in enumerate(values):
        array[i] = value


def _answer_gpus(gpus: list[GpuDevice], count: Any, devices: Any) -> int:
    """NVML's two-call protocol: a NULL array asks the count; a short one is INSUFFICIENT_SIZE."""
    counter = out(count)
    if devices is None:
        counter.value = len(gpus)
        return SUCCESS
    if counter.value < len(gpus):
        counter.value = len(gpus)
        raise NvmlFailure(INSUFFICIENT_SIZE)
    for i, gpu in enumerate(gpus):
        devices[i] = ctypes.pointer(gpu.handle)
    counter.value = len(gpus)
    return SUCCESS
