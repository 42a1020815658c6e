"""GPUs the PCI bus has, next to the GPUs NVML sees: a GPU dead at boot is visible only here.

NVIDIA (vendor ``0x10de``) display controllers, class ``0x0300xx`` (VGA) or ``0x0302xx`` (3D
controller), under ``<sysfs>/bus/pci/devices/*/`` (reference/nvml.md). NVSwitches (class
``0x0680xx``) and the GPUs' audio functions (``0x0403xx``) are not GPUs. The bus is read once,
at start: the point is a GPU that vanished *before* the exporter started (NVML never lists it),
and a scan costs one directory listing plus two small files per PCI function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from .exposition import Family, Sample, gauge
from .logs import get_logger

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")
EXPECTED = gauge(
    "gpu_exporter_expected_gpus",
    "NVIDIA GPUs (display and 3D controllers) on the PCI bus, read from sysfs at start.",
)
VISIBLE = gauge("gpu_exporter_visible_gpus", "GPUs NVML enumerates (nvmlDeviceGetCount).")
_log = get_logger("pci")


def count_pci_gpus(sysfs: Path) -> int | None:
    """NVIDIA GPUs under ``sysfs``; None when the PCI tree cannot be read at all."""
    devices = sysfs / "bus" / "pci" / "devices"
    try:
        entries = sorted(devices.iterdir())
    except OSError as exc:
        _log.warning(
            "cannot read the PCI bus; expected GPUs unknown", path=str(devices), error=str(exc)
        )
        return None
    return sum(1 for entry in entries if _is_nvidia_gpu(entry))


def _is_nvidia_gpu(entry: Path) -> bool:
    try:
        vendor = (entry / "vendor").read_text().strip().lower()
        pci_class = (entry / "class").read_text().strip().lower()
    except OSError:
        return False
    return vendor == NVIDIA_VENDOR and pci_class.startswith(GPU_CLASSES)


class ExpectedGpus:
    """A sample source: ``gpu_exporter_expected_gpus`` and ``gpu_exporter_visible_gpus``."""

    families: Sequence[Family] = (EXPECTED, VISIBLE)

    def __init__(self, sysfs: Path, visible: Callable[[], int | None]) -> None:
        self._expected = count_pci_gpus(sysfs)
        self._visible = visible

    def samples(self) -> Iterable[Sample]:
        if self._expected is not None:
            yield Sample(EXPECTED, "", float(self._expected))
        visible = self._visible()
        if visible is not None:
            yield Sample(VISIBLE, "", float(visible))
