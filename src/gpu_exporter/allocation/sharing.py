"""How each GPU is shared: ``gpu_sharing_info{mode}`` from MIG mode, MPS, and the allocations.

``mig``: the GPU is in MIG mode (its instances are the schedulable devices). ``mps``: MPS clients
run on it (``nvmlDeviceGetMPSComputeRunningProcesses``), or it is in exclusive-process compute
mode (what MPS needs) and several pods hold it. ``time_slicing``: several pods hold it, or it was
allocated through replica ids (``<uuid>::<n>``). ``exclusive``: one pod holds it whole.
``unallocated``: nobody holds it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from ..devices import DeviceId
from .model import PodKey

MODES = ("exclusive", "time_slicing", "mps", "mig", "unallocated")
EXCLUSIVE_PROCESS = 3  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS


def sharing_mode(
    device: DeviceId,
    holders: Collection[PodKey],
    *,
    replicated: bool,
    mps_clients: bool,
    compute_mode: int | None,
) -> str:
    """The mode of one whole GPU (see the module docstring)."""
    if device.mig_mode == "enabled":
        return "mig"
    if mps_clients or (compute_mode == EXCLUSIVE_PROCESS and len(holders) > 1):
        return "mps"
    if len(holders) > 1 or (replicated and holders):
        return "time_slicing"
    return "exclusive" if holders else "unallocated"


def sharing_modes(
    gpus: Iterable[DeviceId],
    holders: Mapping[str, Collection[PodKey]],
    replicated: Collection[str],
    mps_devices: Collection[str],
    compute_modes: Mapping[str, int],
) -> dict[DeviceId, str]:
    """The mode of every whole GPU (MIG instances are left out: their parent says ``mig``)."""
    return {
        gpu: sharing_mode(
            gpu,
            holders.get(gpu.uuid, ()),
            replicated=gpu.uuid in replicated,
            mps_clients=gpu.uuid in mps_devices,
            compute_mode=compute_modes.get(gpu.uuid),
        )
        for gpu in gpus
        if not gpu.is_mig
    }
