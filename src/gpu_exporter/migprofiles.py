"""A MIG instance's profile name without the privileged GPU-instance queries.

``nvmlDeviceGetGpuInstanceById`` needs root (CAP_SYS_ADMIN); a non-root exporter gets
NO_PERMISSION. ``nvmlDeviceGetAttributes`` on the MIG device needs no privileges, and the
parent's GPU instance profile table (``nvmlDeviceGetGpuInstanceProfileInfo`` by profile id, as
``nvidia-smi mig -lgip`` lists it) names the profile whose slices, memory, SMs and media engines
match. Only when no single profile matches is the name derived from the instance's size, which
can differ from NVIDIA's (an H100 7g.80gb has 80384 MiB, 79 GiB).
"""

from __future__ import annotations

import math
from typing import Any

import pynvml

from .nvml import DeviceCalls


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def profile_from_attributes(parent_handle: Any, handle: Any, calls: DeviceCalls) -> str:
    """The profile name of MIG device ``handle`` from unprivileged queries; "" if unreadable.

    A profile matches on slices and media engines (``+me`` profiles differ only there), then
    on the nearest memory size (whether the two memory figures agree exactly on a real GPU is
    unverified); two equally near profiles are ambiguous and the name is derived instead.
    """
    attributes = calls.get(pynvml.nvmlDeviceGetAttributes, handle)
    if attributes is None:
        return ""
    shape = (
        attributes.gpuInstanceSliceCount,
        attributes.sharedDecoderCount,
        attributes.sharedJpegCount,
        attributes.sharedOfaCount,
    )
    candidates: list[tuple[int, str]] = []
    for profile_id in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        # A profile this GPU lacks answers NotSupported once and is not asked again (no log:
        # most ids are other GPUs' profiles).
        info = calls.get(
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo,
            parent_handle,
            profile_id,
            signal=f"gpu_instance_profile{profile_id}",
            quiet=True,
        )
        if info is None:
            continue
        if (info.sliceCount, info.decoderCount, info.jpegCount, info.ofaCount) == shape:
            distance = abs(int(info.memorySizeMB) - int(attributes.memorySizeMB))
            candidates.append((distance, _text(info.name).removeprefix("MIG ").strip()))
    candidates.sort()
    if candidates and (len(candidates) == 1 or candidates[0][0] < candidates[1][0]):
        return candidates[0][1]
    gigabytes = math.ceil(attributes.memorySizeMB / 1024)
    return f"{attributes.gpuInstanceSliceCount}g.{gigabytes}gb"
