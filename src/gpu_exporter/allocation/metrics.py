"""The allocation metric families (SPEC section 5, Allocation)."""

from __future__ import annotations

from ..exposition import counter, gauge

ALLOCATION_INFO = gauge(
    "gpu_allocation_info",
    "A container holds the device through the named resource (kubelet pod-resources); always 1.",
)
ALLOCATED = gauge(
    "gpu_allocated", "1 when a pod holds the schedulable device (a GPU or MIG instance), else 0."
)
ALLOCATED_SECONDS = counter(
    "gpu_allocated_seconds_total", "Time the pod has held the device, in seconds."
)
ALLOCATED_IDLE_SECONDS = counter(
    "gpu_allocated_idle_seconds_total",
    "Time the pod held the device while its activity was below --idle-threshold, in seconds "
    "(SM activity, else NVML utilisation; shared by every pod on a time-sliced device).",
)
IDLE_STREAK = gauge(
    "gpu_allocation_idle_streak_seconds",
    "Current uninterrupted time the pod has held the device idle, in seconds.",
)
CONTAINER_MEMORY = gauge(
    "gpu_container_memory_used_bytes",
    "Device memory used by the container's processes on the device, in bytes.",
)

UNRESOLVED = counter(
    "gpu_exporter_allocation_unresolved_total",
    "Device-plugin ids and DRA devices that resolved to no GPU, by reason; each counts once "
    "when it starts to resolve to nothing.",
)

FAMILIES = (
    ALLOCATION_INFO,
    ALLOCATED,
    ALLOCATED_SECONDS,
    ALLOCATED_IDLE_SECONDS,
    IDLE_STREAK,
    CONTAINER_MEMORY,
    UNRESOLVED,
)
