"""GPU model catalogue, read from ``data/models.yaml``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml


@dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile (NVML_GPU_INSTANCE_PROFILE_*)."""

    name: str
    profile_id: int
    slices: int
    instances: int
    memory_mib: int
    sms: int


@dataclass(frozen=True)
class NvLinkSpec:
    links: int
    version: int
    gbps: float  # per link and direction, GB/s


@dataclass(frozen=True)
class GpuModel:
    """Static facts of one GPU model."""

    key: str
    name: str
    architecture: int
    pci_device_id: int
    memory_mib: int
    reserved_mib: int
    power_limit_w: float
    idle_power_w: float
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    max_mem_clock_mhz: int
    sm_count: int
    gpm: bool
    ecc_default: bool
    memory_repair: str
    field_ids: frozenset[int]
    mig_profiles: Mapping[str, MigProfile]
    nvlink: NvLinkSpec | None = None
    pcie_generation: int = 4
    pcie_width: int = 16
    fabric: str = "none"  # none | nvswitch | nvl
    engines: Mapping[str, int] = field(default_factory=dict)
    thresholds: Mapping[str, int] = field(default_factory=dict)
    vbios: str = ""
    compute_capability: tuple[int, int] | None = None  # CUDA major.minor
    bar1_mib: int | None = None

    @property
    def supports_mig(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def row_remapping(self) -> bool:
        return self.memory_repair == "row_remap"

    @property
    def page_retirement(self) -> bool:
        return self.memory_repair == "page_retirement"


# Every MIG-capable model here has 7 compute slices.
MIG_SLICES = 7


def _model(key: str, raw: Mapping[str, Any]) -> GpuModel:
    profiles = {
        name: MigProfile(
            name=name,
            profile_id=int(p["id"]),
            slices=int(p["slices"]),
            instances=int(p["instances"]),
            memory_mib=int(p["memory_mib"]),
            sms=int(p["sms"]),
        )
        for name, p in (raw.get("mig_profiles") or {}).items()
    }
    return GpuModel(
        key=key,
        name=str(raw["name"]),
        architecture=int(raw["architecture"]),
        pci_device_id=int(raw["pci_device_id"]),
        memory_mib=int(raw["memory_mib"]),
        reserved_mib=int(raw["reserved_mib"]),
        power_limit_w=float(raw["power_limit_w"]),
        idle_power_w=float(raw["idle_power_w"]),
        max_sm_clock_mhz=int(raw["max_sm_clock_mhz"]),
        idle_sm_clock_mhz=int(raw["idle_sm_clock_mhz"]),
        max_mem_clock_mhz=int(raw["max_mem_clock_mhz"]),
        sm_count=int(raw["sm_count"]),
        gpm=bool(raw["gpm"]),
        ecc_default=bool(raw["ecc_default"]),
        memory_repair=str(raw["memory_repair"]),
        field_ids=frozenset(int(f) for f in raw["field_ids"]),
        mig_profiles=profiles,
        nvlink=NvLinkSpec(**raw["nvlink"]) if "nvlink" in raw else None,
        pcie_generation=int(raw["pcie"]["generation"]),
        pcie_width=int(raw["pcie"]["width"]),
        fabric=str(raw["fabric"]),
        engines={k: int(v) for k, v in raw["engines"].items()},
        thresholds={k: int(v) for k, v in raw["thresholds"].items()},
        vbios=str(raw["vbios"]),
        compute_capability=_capability(raw.get("compute_capability")),
        bar1_mib=int(raw["bar1_mib"]) if "bar1_mib" in raw else None,
    )


def _capability(raw: Any) -> tuple[int, int] | None:
    if raw is None:
        return None
    major, minor = str(raw).split(".")
    return int(major), int(minor)


def load_models() -> Mapping[str, GpuModel]:
    """The model catalogue (the data file ships with the package)."""
    text = resources.files("gpu_exporter.simulator").joinpath("data/models.yaml").read_text()
    raw: Mapping[str, Mapping[str, Any]] = yaml.safe_load(text)
    return {key: _model(key, spec) for key, spec in raw.items()}
