"""Identity and health series, built from the inventory without NVML calls."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from . import __version__
from .devices import Device, SystemInfo, activity_source_name, idle_source_label
from .exposition import Sample, gauge, join_labels, label_string

BUILD_INFO = gauge(
    "gpu_exporter_build_info", "Exporter version with the driver and NVML versions it runs on."
)
GPU_INFO = gauge("gpu_info", "Identity of each GPU (join on gpu/uuid with group_left); always 1.")
MIG_INFO = gauge("gpu_mig_info", "Identity of each MIG instance and its parent GPU; always 1.")
GPU_UP = gauge("gpu_up", "1 when the GPU answers NVML, 0 while it is lost.")

FAMILIES = (BUILD_INFO, GPU_INFO, MIG_INFO, GPU_UP)


def build_info(system: SystemInfo | None) -> Sample:
    labels = label_string(
        {
            "version": __version__,
            "driver_version": system.driver_version if system else "",
            "nvml_version": system.nvml_version if system else "",
        }
    )
    return Sample(BUILD_INFO, labels, 1.0)


def gpu_info(device: Device, driver_version: str) -> Sample:
    extra = label_string(
        {
            "model": device.id.model,
            "pci_bus_id": device.id.pci_bus_id,
            "driver_version": driver_version,
            "mig_mode": device.id.mig_mode,
            "activity_source": activity_source_name(device.id),
            "idle_source": idle_source_label(device.id),
            "persistence_mode": device.id.persistence_mode,
            "compute_mode": device.id.compute_mode,
            "serial": device.id.serial,
            "vbios_version": device.id.vbios_version,
        }
    )
    return Sample(GPU_INFO, join_labels(device.id.labels, extra), 1.0)


def mig_info(device: Device) -> Sample:
    ident = device.id
    labels = label_string(
        {
            "gpu": str(ident.index),
            "uuid": ident.uuid,
            "parent_uuid": ident.parent_uuid or "",
            "gpu_instance_id": str(ident.gpu_instance_id),
            "compute_instance_id": str(ident.compute_instance_id),
            "mig_profile": ident.mig_profile or "",
        }
    )
    return Sample(MIG_INFO, labels, 1.0)


def identity_samples(devices: Iterable[Device], driver_version: str) -> Iterator[Sample]:
    for device in devices:
        yield mig_info(device) if device.id.is_mig else gpu_info(device, driver_version)


def up_sample(gpu_labels: str, up: bool) -> Sample:
    return Sample(GPU_UP, gpu_labels, 1.0 if up else 0.0)
