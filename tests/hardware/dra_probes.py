"""What DRA attribution takes from a real node (issue 15), asked directly and printed.

The exporter resolves DRA claims by device minor (``/dev/nvidia<minor>``, CDI specs, the
``gpu-<minor>`` device names) and, for MIG, by ``/proc/driver/nvidia-caps/mig-minors``. Only a
real driver settles whether the minors NVML reports are the device nodes present, how they
relate to the NVML index, and what ``mig-minors`` looks like and whether it can be read here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pynvml

from gpu_exporter.allocation.cdi import parse_mig_minors

MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")


def dra_probes(gpus: int) -> dict[str, Any]:
    """Per GPU: NVML index, minor, bus id and whether its device node exists; mig-minors."""
    result: dict[str, Any] = {"gpus": {}}
    for index in range(gpus):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        try:
            minor: Any = int(pynvml.nvmlDeviceGetMinorNumber(handle))
        except pynvml.NVMLError as exc:
            minor = f"error {exc}"
        bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
        node = f"/dev/nvidia{minor}"
        result["gpus"][str(index)] = {
            "minor": minor,
            "pci_bus_id": bus.decode() if isinstance(bus, bytes) else str(bus),
            "device_node_exists": isinstance(minor, int) and os.path.exists(node),
        }
    try:
        text = MIG_MINORS.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        result["mig_minors"] = f"unreadable: {exc.strerror or exc}"
    else:
        lines = text.splitlines()
        parsed = parse_mig_minors(text)
        result["mig_minors"] = {
            "lines": len(lines),
            "parsed": len(parsed),
            "first": lines[:4],
            "gpu_minors": sorted({m.gpu_minor for m in parsed.values()})[:8],
        }
    return result
