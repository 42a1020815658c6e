"""A ``/sys/bus/pci/devices`` tree for the simulated node: every GPU (a GPU missing at boot too,
as the bus still has it), its audio function, and the HGX board's NVSwitches; each GPU function
with the ``numa_node`` and ``local_cpulist`` the kernel gives it; and ``/sys/devices/system/node``
with each NUMA node's ``cpulist`` (a GPU memory node of a coherent system has no CPUs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpu_exporter.simulator.node import SimulatedNode

NVIDIA = "0x10de"
GPU_CLASS = "0x030200"  # 3D controller
AUDIO_CLASS = "0x040300"
NVSWITCH_CLASS = "0x068000"
NVSWITCH_BUSES = (0x05, 0x06, 0x07, 0x08)


def _function(root: Path, address: str, pci_class: str, device: int) -> Path:
    entry = root / address
    entry.mkdir(parents=True, exist_ok=True)
    (entry / "vendor").write_text(NVIDIA + "\n")
    (entry / "class").write_text(pci_class + "\n")
    (entry / "device").write_text(f"0x{device:04x}\n")
    return entry


def _locality(entry: Path, numa_node: int, cpulist: str) -> None:
    (entry / "numa_node").write_text(f"{numa_node}\n")
    (entry / "local_cpulist").write_text(cpulist + "\n")


def write_pci_tree(node: SimulatedNode, sysfs: Path) -> Path:
    """Write the tree under ``sysfs`` (``<sysfs>/bus/pci/devices``); returns ``sysfs``."""
    devices = sysfs / "bus" / "pci" / "devices"
    devices.mkdir(parents=True, exist_ok=True)
    topology = node.topology
    for gpu in node.gpus:
        device = gpu.model.pci_device_id >> 16
        numa_node = topology.places[gpu.index].numa_node
        cpulist = topology.layout.cpulists[numa_node]
        for function, pci_class, device_id in (
            (0, GPU_CLASS, device),
            (1, AUDIO_CLASS, device + 1),
        ):
            entry = _function(devices, f"0000:{gpu.bus:02x}:00.{function}", pci_class, device_id)
            _locality(entry, numa_node, cpulist)
    if any(gpu.model.fabric == "nvswitch" for gpu in node.gpus):
        for bus in NVSWITCH_BUSES:
            _function(devices, f"0000:{bus:02x}:00.0", NVSWITCH_CLASS, 0x22A3)
    _write_numa_nodes(node, sysfs / "devices" / "system" / "node")
    return sysfs


def _write_numa_nodes(node: SimulatedNode, root: Path) -> None:
    topology = node.topology
    cpulists = dict(enumerate(topology.layout.cpulists))
    for place in topology.places:
        memory_node = place.slot.gpu_memory_numa_node
        if memory_node is not None:
            cpulists.setdefault(memory_node, "")
    for number, cpulist in sorted(cpulists.items()):
        entry = root / f"node{number}"
        entry.mkdir(parents=True, exist_ok=True)
        (entry / "cpulist").write_text(cpulist + "\n")
