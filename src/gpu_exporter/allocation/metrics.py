"""The allocation metric families (SPEC section 5, Allocation), and their label sets."""

from __future__ import annotations

from functools import lru_cache

from ..exposition import counter, gauge, join_labels, label_string

ALLOCATION_INFO = gauge(
    "gpu_allocation_info",
    "A container holds the device (source: pod-resources or dra, through the named resource; "
    'process: its processes run on a device it holds no allocation of, resource=""); always 1.',
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
    "(SM activity, else NVML utilisation; on a shared device, its own processes' share).",
)
IDLE_STREAK = gauge(
    "gpu_allocation_idle_streak_seconds",
    "Current uninterrupted time the pod has held the device idle, in seconds.",
)
CONTAINER_MEMORY = gauge(
    "gpu_container_memory_used_bytes",
    "Device memory used by the container's processes on the device, in bytes.",
)
CONTAINER_SM_ACTIVE = gauge(
    "gpu_container_sm_active_ratio",
    "Share of the last sampling window the container's processes had a kernel resident on the "
    'device (NVML per-process utilisation; container="" sums processes of no known container).',
    served=False,  # the status page's; Prometheus reads rate() of the integral below
)
CONTAINER_SM_ACTIVE_SECONDS = counter(
    "gpu_container_sm_active_seconds_total",
    "Seconds the container's processes had a kernel resident on the device (NVML per-process "
    'utilisation; container="" sums processes of no known container): rate() is the mean share.',
)
CONTAINER_MEMORY_BANDWIDTH = gauge(
    "gpu_container_memory_bandwidth_ratio",
    "Share of the device's memory bandwidth the container's processes used in the last window.",
)
SHARING_INFO = gauge(
    "gpu_sharing_info",
    "How the GPU is shared (mode: exclusive, time_slicing, mps, mig, unallocated); always 1.",
)
PATH_INFO = gauge(
    "gpu_allocation_path_info",
    "The weakest path between any two GPUs a pod holds on the node (path: nvlink, pcie_switch, "
    "pcie_host_bridge, numa, system), and the best any as many GPUs among the free ones and its "
    "own had (best_path), read once per allocation change; pods of two or more GPUs; always 1.",
)
NUMA_ALIGNED = gauge(
    "gpu_allocation_numa_aligned_ratio",
    "Fraction of the container's CPUs (the kubelet's static CPU manager) on the NUMA node of the "
    "device's GPU; absent when the kubelet lists no CPU ids for the container.",
)
MEMORY_NUMA_ALIGNED = gauge(
    "gpu_allocation_memory_numa_aligned_ratio",
    "Fraction of the container's memory NUMA nodes (the kubelet's memory manager) that are the "
    "device's GPU's node; absent when the kubelet lists none.",
)
SM_BAND_SECONDS = counter(
    "gpu_allocation_sm_activity_band_seconds_total",
    "Seconds the pod held the device with SM activity in each band (low: below 10%, mid: "
    "10-50%, high: above 50%), judged per sample interval like gpu_sm_activity_band_seconds_total.",
)

UNATTRIBUTED_MEMORY = gauge(
    "gpu_unattributed_memory_used_bytes",
    "Device memory used by processes of no pod (class=no_pod: host or system processes) or of a "
    "pod the kubelet no longer lists (class=gone: zombies), in bytes; present while non-zero.",
)
UNATTRIBUTED_SM_ACTIVE_SECONDS = counter(
    "gpu_unattributed_sm_active_seconds_total",
    "Time processes of no pod (class=no_pod) or of a gone pod (class=gone) had a kernel resident "
    "on the device (NVML per-process utilisation), in seconds.",
)

UNRESOLVED = counter(
    "gpu_exporter_allocation_unresolved_total",
    "Device-plugin ids and DRA devices that resolved to no GPU, by reason; each counts once "
    "when it starts to resolve to nothing.",
)

FOLDED = gauge(
    "gpu_exporter_allocation_folded",
    "What the bounds left out of the kubelet's last List answer (docs/security.md): device ids "
    "(what=device_ids) and (device, pod) holders (what=holders); their time is not accounted.",
)
SOURCE_TRANSITIONS = counter(
    "gpu_exporter_source_transitions_total",
    "Times the allocation source went up or down (a flapping source counts every change; the "
    "log says so at most once a minute).",
)

SLURM_JOB_INFO = gauge(
    "gpu_slurm_job_info",
    "A Slurm job holds the GPU (--allocation.source=slurm or slurm-job-map; the mapping "
    "directory names no account or partition); always 1. Join on gpu, uuid and job_id.",
)

FAMILIES = (
    ALLOCATION_INFO,
    ALLOCATED,
    ALLOCATED_SECONDS,
    ALLOCATED_IDLE_SECONDS,
    IDLE_STREAK,
    CONTAINER_MEMORY,
    UNRESOLVED,
    CONTAINER_SM_ACTIVE,
    CONTAINER_SM_ACTIVE_SECONDS,
    CONTAINER_MEMORY_BANDWIDTH,
    SHARING_INFO,
    UNATTRIBUTED_MEMORY,
    UNATTRIBUTED_SM_ACTIVE_SECONDS,
    FOLDED,
    SOURCE_TRANSITIONS,
    SLURM_JOB_INFO,
    PATH_INFO,
    NUMA_ALIGNED,
    MEMORY_NUMA_ALIGNED,
    SM_BAND_SECONDS,
)


@lru_cache(maxsize=8192)
def holder_labels(
    device_labels: str, namespace: str, pod: str, container: str | None = None
) -> str:
    """A device's labels and a holder's, escaped once per holder and device rather than on
    every render (a 100-pod MIG node rebuilt ~350 label sets a second). Bounded: holders come
    and go over a node's life."""
    extra = {"namespace": namespace, "pod": pod}
    if container is not None:
        extra["container"] = container
    return join_labels(device_labels, label_string(extra))


@lru_cache(maxsize=8192)
def job_labels(
    device_labels: str, namespace: str, job_id: str, container: str | None = None
) -> str:
    """A device's labels and a Slurm job's, for the series :func:`holder_labels` labels on a
    Kubernetes node: ``job_id`` instead of ``namespace``/``pod``/``container`` (a job holder
    is ("", job id)), so Kubernetes nodes' series keep their labels."""
    return join_labels(device_labels, label_string({"job_id": job_id}))


@lru_cache(maxsize=8192)
def slurm_job_labels(
    device_labels: str, job_id: str, user: str, account: str, partition: str
) -> str:
    extra = {"job_id": job_id, "user": user, "account": account, "partition": partition}
    return join_labels(device_labels, label_string(extra))


@lru_cache(maxsize=8192)
def info_labels(
    device_labels: str, namespace: str, pod: str, container: str, resource: str, source: str
) -> str:
    """gpu_allocation_info's labels, escaped once per holding (see :func:`holder_labels`)."""
    extra = {
        "namespace": namespace,
        "pod": pod,
        "container": container,
        "resource": resource,
        "source": source,
    }
    return join_labels(device_labels, label_string(extra))


@lru_cache(maxsize=1024)
def class_labels(device_labels: str, process_class: str) -> str:
    return join_labels(device_labels, label_string({"class": process_class}))


@lru_cache(maxsize=1024)
def mode_labels(device_labels: str, mode: str) -> str:
    return join_labels(device_labels, label_string({"mode": mode}))


@lru_cache(maxsize=8192)
def band_labels(holder: str, band: str) -> str:
    return join_labels(holder, label_string({"band": band}))


@lru_cache(maxsize=8192)
def fit_labels(holder: str, profile: str) -> str:
    return join_labels(holder, label_string({"profile": profile}))


def fraction_labels(model: str, profile: str) -> str:
    return label_string({"model": model, "profile": profile})
