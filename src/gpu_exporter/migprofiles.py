"""MIG GPU-instance profiles: what a GPU offers, and a MIG instance's name without privileges.

The parent's GPU instance profile table (``nvmlDeviceGetGpuInstanceProfileInfo`` by profile id, as
``nvidia-smi mig -lgip`` lists it) is read in one place, :func:`profile_infos`. Two users:

- :func:`profile_from_attributes`: ``nvmlDeviceGetGpuInstanceById`` needs root (CAP_SYS_ADMIN); a
  non-root exporter gets NO_PERMISSION. ``nvmlDeviceGetAttributes`` on the MIG device needs no
  privileges, and the table names the profile whose slices, memory, SMs and media engines
  match. Only when no single profile matches is the name derived from the instance's size,
  which can differ from NVIDIA's (an H100 7g.80gb has 80384 MiB, 79 GiB).
- :func:`nvml_table` (the mig_profiles collector and right-sizing): the profiles with their
  memory and share of the GPU's compute slices. NVML answers only while MIG mode is on (nvml.h:
  NOT_SUPPORTED "if device doesn't have MIG mode enabled"); otherwise :func:`catalog_table`
  answers from ``data/mig_profiles.tsv`` by model name.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import pynvml

from .nvml import DeviceCalls

CATALOG = "data/mig_profiles.tsv"


@dataclass(frozen=True)
class Profile:
    name: str  # NVIDIA's, without "MIG ": 1g.10gb, 1g.10gb+me
    slices: int  # compute slices
    memory_mib: int


@dataclass(frozen=True)
class ProfileTable:
    """The GPU-instance profiles one GPU offers; ``source`` is ``nvml`` or ``catalog``."""

    profiles: tuple[Profile, ...]
    total_slices: int
    source: str

    def compute_fraction(self, profile: Profile) -> float:
        return profile.slices / self.total_slices


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def profile_name(info: Any) -> str:
    return _text(info.name).removeprefix("MIG ").strip()


def profile_infos(parent_handle: Any, calls: DeviceCalls) -> list[Any]:
    """Every profile the GPU answers for (``nvmlGpuInstanceProfileInfo_v2`` structs).

    A profile id the GPU lacks answers NotSupported once and is not asked again (no log: most
    ids are other GPUs' profiles); so is every id while MIG mode is off, until the GPU's layout
    changes (the sampler then forgets what the GPU lacked).
    """
    infos = []
    for profile_id in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = calls.get(
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo,
            parent_handle,
            profile_id,
            signal=f"gpu_instance_profile{profile_id}",
            quiet=True,
        )
        if info is not None:
            infos.append(info)
    return infos


def nvml_table(parent_handle: Any, calls: DeviceCalls) -> ProfileTable | None:
    """The GPU's profile table from NVML; None when it answers for no profile."""
    infos = profile_infos(parent_handle, calls)
    if not infos:
        return None
    profiles = tuple(
        Profile(profile_name(i), int(i.sliceCount), int(i.memorySizeMB)) for i in infos
    )
    # The whole-GPU profile (7g on A100/H100/H200/B200, 4g on A30) has every slice.
    return ProfileTable(profiles, max(p.slices for p in profiles), "nvml")


def catalog_table(model: str) -> ProfileTable | None:
    """The profiles ``data/mig_profiles.tsv`` lists for ``model`` (nvmlDeviceGetName's string)."""
    return _catalog().get(model)


@cache
def _catalog() -> dict[str, ProfileTable]:
    text = resources.files("gpu_exporter").joinpath(CATALOG).read_text()
    rows: dict[str, list[Profile]] = {}
    totals: dict[str, int] = {}
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    for number, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        if len(cells) != 6 or cells[5] not in ("seen", "estimate"):
            raise ValueError(f"{CATALOG}: row {number}: malformed {line[:60]!r}")
        models, name, slices, total, memory, _status = cells
        for model in (m.strip() for m in models.split(",")):
            rows.setdefault(model, []).append(Profile(name, int(slices), int(memory)))
            if totals.setdefault(model, int(total)) != int(total):
                raise ValueError(f"{CATALOG}: row {number}: {model} total slices differ")
    return {m: ProfileTable(tuple(p), totals[m], "catalog") for m, p in rows.items()}


class MigProfileBook:
    """The profile table of each GPU (by UUID), written by the mig_profiles collector on a worker
    thread and read by right-sizing on the event loop (like the ActivityLedger)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[str, ProfileTable] = {}
        self._models: dict[str, str] = {}

    def record(self, uuid: str, table: ProfileTable, model: str = "") -> None:
        with self._lock:
            self._tables[uuid] = table
            self._models[uuid] = model

    def table(self, uuid: str) -> ProfileTable | None:
        with self._lock:
            return self._tables.get(uuid)

    def compute_fractions(self) -> dict[tuple[str, str], float]:
        """(model, profile) -> the profile's share of the GPU's compute slices, over every GPU
        recorded: a fact of the model, the same whichever of its GPUs (or the catalog) said it."""
        with self._lock:
            recorded = [(self._models[uuid], table) for uuid, table in self._tables.items()]
        fractions: dict[tuple[str, str], float] = {}
        for model, table in recorded:
            for profile in table.profiles:
                fractions.setdefault((model, profile.name), table.compute_fraction(profile))
        return dict(sorted(fractions.items()))


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
    for info in profile_infos(parent_handle, calls):
        if (info.sliceCount, info.decoderCount, info.jpegCount, info.ofaCount) == shape:
            distance = abs(int(info.memorySizeMB) - int(attributes.memorySizeMB))
            candidates.append((distance, profile_name(info)))
    candidates.sort()
    if candidates and (len(candidates) == 1 or candidates[0][0] < candidates[1][0]):
        return candidates[0][1]
    gigabytes = math.ceil(attributes.memorySizeMB / 1024)
    return f"{attributes.gpuInstanceSliceCount}g.{gigabytes}gb"
