"""A ``/sys/bus/pci/devices`` tree for the simulated node: every GPU (a GPU missing at boot too,
as the bus still has it), its audio function, and the HGX board's NVSwitches."""

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


def _function(root: Path, address: str, pci_class: str, device: int) -> None:
    entry = root / address
    entry.mkdir(parents=True, exist_ok=True)
    (entry / "vendor").write_text(NVIDIA + "\n")
    (entry / "class").write_text(pci_class + "\n")
    (entry / "device").write_text(f"0x{device:04x}\n")


def write_pci_tree(node: SimulatedNode, sysfs: Path) -> Path:
    """Write the tree under ``sysfs`` (``<sysfs>/bus/pci/devices``); returns ``sysfs``."""
    devices = sysfs / "bus" / "pci" / "devices"
    devices.mkdir(parents=True, exist_ok=True)
    for gpu in node.gpus:
        device = gpu.model.pci_device_id >> 16
        _function(devices, f"0000:{gpu.bus:02x}:00.0", GPU_CLASS, device)
        _function(devices, f"0000:{gpu.bus:02x}:00.1", AUDIO_CLASS, device + 1)
    if any(gpu.model.fabric == "nvswitch" for gpu in node.gpus):
        for bus in NVSWITCH_BUSES:
            _function(devices, f"0000:{bus:02x}:00.0", NVSWITCH_CLASS, 0x22A3)
    return sysfs
