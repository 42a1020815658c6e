"""Scenario files: parsing and validation (the schema is documented in ``docs/simulator.md``).

A scenario is a YAML mapping with the keys ``node``, ``gpus``, ``workloads``, ``allocations`` and
``timeline``. Everything is validated up front; any problem raises :class:`ScenarioError` whose
message is one line, ``<file>: <key.path[2].sub>: <reason>``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_exporter.safeyaml import quote
from gpu_exporter.simulator import schema as s
from gpu_exporter.simulator.errors import Invalid
from gpu_exporter.simulator.models import MIG_SLICES, GpuModel, MigProfile, load_models
from gpu_exporter.simulator.patterns import IDLE, Pattern
from gpu_exporter.simulator.topology import default_layout, layouts, node_topology
from gpu_exporter.simulator.units import parse_bytes, parse_duration

BUILTIN_SOURCE = "<builtin>"
THROTTLE_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
RECOVERY_ACTIONS = {
    "none": 0,
    "gpu_reset": 1,
    "node_reboot": 2,
    "drain_p2p": 3,
    "drain_and_reset": 4,
}
# DCGM maintainers (NVIDIA/DCGM#162): these Xids never arrive as NVML events, only in kmsg.
KMSG_ONLY_XIDS = frozenset({79, 119, 120})


@dataclass(frozen=True)
class NodeSpec:
    name: str = "sim-node"
    driver_version: str = "580.95.05"
    cuda_version: str = "13.0"
    boot_id: str = ""
    uptime: float = 3600.0
    # False: NVML answers as it does to a caller without root (CAP_SYS_ADMIN): see simulator.md.
    privileged: bool = True
    # The NVLink domain GPUs with a rack-scale fabric (GB200 NVL72) belong to.
    fabric_cluster_uuid: str = "6d1b2c8e-3f4a-5b6c-8d7e-9f0a1b2c3d4e"
    fabric_clique_id: int = 1
    # The layout of data/topology.yaml the node's GPUs sit in ("": its first GPU's model's).
    topology: str = ""

    @property
    def driver_major(self) -> int:
        return int(self.driver_version.split(".")[0])


@dataclass(frozen=True)
class MigInstanceSpec:
    """One MIG instance: its profile, GPU instance id and slice placement."""

    index: int
    profile: MigProfile
    gpu_instance_id: int
    start_slice: int


@dataclass(frozen=True)
class GpuSpec:
    index: int
    model: GpuModel
    mig: tuple[MigInstanceSpec, ...] | None
    ecc: bool
    minor: int = -1  # the device minor (/dev/nvidia<minor>); -1: the index
    compute_mode: int = 0  # NVML_COMPUTEMODE_*: 0 default, 2 prohibited, 3 exclusive process

    @property
    def device_minor(self) -> int:
        return self.index if self.minor < 0 else self.minor

    @property
    def mig_enabled(self) -> bool:
        return self.mig is not None


@dataclass(frozen=True)
class WorkloadSpec:
    gpu: int
    mig: int | None
    pod: str
    namespace: str
    container: str
    pid: int | None
    process_name: str
    memory: int
    sm: Pattern
    tensor: Pattern
    dram: Pattern
    occupancy: Pattern | None
    utilization: Pattern | None
    memory_reported: bool = True  # False: usedGpuMemory is NVML_VALUE_NOT_AVAILABLE
    mps: bool = False  # an MPS client (listed by nvmlDeviceGetMPSComputeRunningProcesses)
    # GPU use the allocator never sees (docs/simulator.md, "Unallocated use"): a pod that holds
    # no allocation of the device; one using a KAI-style reservation pod's device
    # ("namespace/pod"); a process of a deleted pod (the kubelet no longer lists it).
    unrequested: bool = False
    reservation: str = ""
    deleted: bool = False


@dataclass(frozen=True)
class AllocationSpec:
    gpu: int
    mig: int | None
    replica: int | None
    pod: str
    namespace: str
    container: str
    resource: str
    # DRA: the ResourceClaim (in the pod's namespace) through which the pod holds the device,
    # instead of a device plugin; and a ComputeDomain channel claim the container also holds.
    claim: str | None = None
    compute_domain_claim: str | None = None
    # The container's exclusive CPUs (the static CPU manager) and the NUMA nodes the memory
    # manager gave it, as pod-resources lists them per container: () when it lists none.
    cpu_ids: tuple[int, ...] = ()
    memory_numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class EventSpec:
    """One validated event. ``params`` holds normalised values; ``raw`` the input as given."""

    type: str
    params: Mapping[str, Any]
    raw: Mapping[str, Any]
    at: float | None = None
    repeat: float | None = None


@dataclass(frozen=True)
class Scenario:
    source: str
    node: NodeSpec
    gpus: tuple[GpuSpec, ...]
    workloads: tuple[WorkloadSpec, ...] = ()
    allocations: tuple[AllocationSpec, ...] = ()
    timeline: tuple[EventSpec, ...] = field(default=())


# --------------------------------------------------------------------------- the parts


def parse_parts(data: Any) -> tuple[Mapping[str, Any], Scenario]:
    """The scenario's mapping and everything in it but the timeline, which ``loader.py`` adds
    (its events are validated by ``events.py``, which needs these specs)."""
    if data is None:
        data = {}
    top = s.mapping(data, "", {"node", "gpus", "workloads", "allocations", "timeline"}, {"gpus"})
    node = _node(top.get("node") or {}, "node")
    gpus = _gpus(top["gpus"], "gpus")
    if not node.topology:
        node = dataclasses.replace(node, topology=default_layout(gpus[0].model.key))
    workloads = tuple(
        _workload(raw, s.item("workloads", i), gpus)
        for i, raw in enumerate(s.sequence(top.get("workloads"), "workloads"))
    )
    _check_memory(workloads, gpus)
    allocations = tuple(
        _allocation(raw, s.item("allocations", i), gpus)
        for i, raw in enumerate(s.sequence(top.get("allocations"), "allocations"))
    )
    _check_placement(allocations, node, len(gpus))
    _check_unallocated_use(workloads, allocations)
    return top, Scenario("", node, gpus, workloads, allocations)


# --------------------------------------------------------------------------- node and GPUs


def _node(raw: Any, path: str) -> NodeSpec:
    keys = {
        "name",
        "driver_version",
        "cuda_version",
        "boot_id",
        "uptime",
        "privileged",
        "fabric_cluster_uuid",
        "fabric_clique_id",
        "topology",
    }
    node = s.mapping(raw, path, keys)
    name = s.text(node.get("name", NodeSpec.name), s.key(path, "name"))
    driver = s.text(
        node.get("driver_version", NodeSpec.driver_version),
        s.key(path, "driver_version"),
        r"\d+\.\d+(\.\d+)?",
    )
    cuda = s.text(
        node.get("cuda_version", NodeSpec.cuda_version), s.key(path, "cuda_version"), r"\d+\.\d+"
    )
    default_boot = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.boot"))
    boot_id = s.text(node.get("boot_id", default_boot), s.key(path, "boot_id"))
    uptime = parse_duration(node.get("uptime", NodeSpec.uptime), s.key(path, "uptime"))
    privileged = s.boolean(node.get("privileged", True), s.key(path, "privileged"))
    cluster = s.text(
        node.get("fabric_cluster_uuid", NodeSpec.fabric_cluster_uuid),
        s.key(path, "fabric_cluster_uuid"),
        r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    )
    clique = s.integer(
        node.get("fabric_clique_id", NodeSpec.fabric_clique_id),
        s.key(path, "fabric_clique_id"),
        0,
        2**32 - 1,
    )
    topology = (
        s.choice(node["topology"], s.key(path, "topology"), layouts()) if "topology" in node else ""
    )
    return NodeSpec(
        name, driver, cuda, boot_id, uptime, privileged, cluster.lower(), clique, topology
    )


def _gpus(raw: Any, path: str) -> tuple[GpuSpec, ...]:
    entries = s.sequence(raw, path)
    if not entries:
        raise Invalid(path, "at least one GPU is required")
    gpus: list[GpuSpec] = []
    for i, entry in enumerate(entries):
        gpus.extend(_gpu_entry(entry, s.item(path, i), len(gpus)))
    return tuple(gpus)


def _gpu_entry(raw: Any, path: str, first_index: int) -> list[GpuSpec]:
    if isinstance(raw, str):
        raw = {"model": raw}
    keys = {"model", "count", "mig", "ecc", "minor", "compute_mode"}
    entry = s.mapping(raw, path, keys, {"model"})
    models = load_models()
    name = s.choice(entry["model"], s.key(path, "model"), models)
    model = models[name]
    count = s.integer(entry.get("count", 1), s.key(path, "count"), 1, 64)
    mig = mig_layout(entry["mig"], s.key(path, "mig"), model) if "mig" in entry else None
    ecc = s.boolean(entry.get("ecc", model.ecc_default), s.key(path, "ecc"))
    # Device minors: the index by default; ``minor`` numbers this entry's GPUs from there.
    minor = s.integer(entry["minor"], s.key(path, "minor"), 0, 255) if "minor" in entry else None
    mode = s.choice(
        entry.get("compute_mode", "default"), s.key(path, "compute_mode"), COMPUTE_MODES
    )
    return [
        GpuSpec(
            first_index + n,
            model,
            mig,
            ecc,
            minor=-1 if minor is None else minor + n,
            compute_mode=COMPUTE_MODES[mode],
        )
        for n in range(count)
    ]


# nvmlDeviceGetComputeMode's answers (NVML_COMPUTEMODE_*; 1, exclusive thread, was removed).
COMPUTE_MODES = {"default": 0, "prohibited": 2, "exclusive_process": 3}


def mig_layout(raw: Any, path: str, model: GpuModel) -> tuple[MigInstanceSpec, ...]:
    if not model.supports_mig:
        raise Invalid(path, f"model {model.key} does not support MIG")
    names = s.sequence(raw, path)
    profiles = [_mig_profile(name, s.item(path, i), model) for i, name in enumerate(names)]
    slices = sum(p.slices for p in profiles)
    if slices > MIG_SLICES:
        raise Invalid(path, f"instances need {slices} slices, a {model.key} has {MIG_SLICES}")
    for profile in profiles:
        if sum(p is profile for p in profiles) > profile.instances:
            reason = f"at most {profile.instances} instance(s) of {profile.name} fit on one GPU"
            raise Invalid(path, reason)
    return _place(profiles)


def _mig_profile(raw: Any, path: str, model: GpuModel) -> MigProfile:
    if not isinstance(raw, str) or raw not in model.mig_profiles:
        valid = ", ".join(model.mig_profiles)
        problem = f"MIG profile {quote(raw)} is not valid for {model.key} (valid: {valid})"
        raise Invalid(path, problem)
    return model.mig_profiles[raw]


def _place(profiles: Sequence[MigProfile]) -> tuple[MigInstanceSpec, ...]:
    """Place instances left to right; GPU instance ids count from 1 in creation order."""
    placed: list[MigInstanceSpec] = []
    start = 0
    for index, profile in enumerate(profiles):
        placed.append(MigInstanceSpec(index, profile, index + 1, start))
        start += profile.slices
    return tuple(placed)


# --------------------------------------------------------------------------- workloads, allocations

WORKLOAD_KEYS = {
    "gpu",
    "mig",
    "pod",
    "namespace",
    "container",
    "pid",
    "process_name",
    "memory",
    "sm",
    "tensor",
    "dram",
    "occupancy",
    "utilization",
    "memory_reported",
    "mps",
    "unrequested",
    "reservation",
    "deleted",
    "host",
}


def device_of(raw: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> tuple[int, int | None]:
    """The (gpu, mig) pair a workload or allocation names, checked against the node."""
    gpu = gpu_index(raw.get("gpu"), s.key(path, "gpu"), gpus)
    spec = gpus[gpu]
    if "mig" not in raw:
        if spec.mig is not None:
            top = len(spec.mig) - 1
            raise Invalid(
                s.key(path, "mig"), f"gpu {gpu} is in MIG mode: name an instance 0..{top}"
            )
        return gpu, None
    if spec.mig is None:
        raise Invalid(s.key(path, "mig"), f"gpu {gpu} is not in MIG mode")
    if not spec.mig:
        raise Invalid(s.key(path, "mig"), f"gpu {gpu} has no MIG instances")
    return gpu, s.integer(raw["mig"], s.key(path, "mig"), 0, len(spec.mig) - 1)


def gpu_index(raw: Any, path: str, gpus: Sequence[GpuSpec]) -> int:
    if raw is None:
        raise Invalid(path, "required key is missing")
    index = s.integer(raw, path, 0)
    if index >= len(gpus):
        raise Invalid(path, f"gpu index {index} out of range (the node has {len(gpus)} GPUs)")
    return index


def _workload(raw: Any, path: str, gpus: Sequence[GpuSpec]) -> WorkloadSpec:
    w = s.mapping(raw, path, WORKLOAD_KEYS, {"gpu"})
    gpu, mig = device_of(w, path, gpus)
    return build_workload(w, path, gpu, mig)


def build_workload(w: Mapping[str, Any], path: str, gpu: int, mig: int | None) -> WorkloadSpec:
    def opt_pattern(name: str) -> Pattern | None:
        return s.pattern(w[name], s.key(path, name)) if name in w else None

    pid = s.integer(w["pid"], s.key(path, "pid"), 1, 2**22) if "pid" in w else None
    _check_pod_keys(w, path)
    return WorkloadSpec(
        gpu=gpu,
        mig=mig,
        pod=s.text(w.get("pod", ""), s.key(path, "pod")) if w.get("pod") else "",
        namespace=s.text(w.get("namespace", "default"), s.key(path, "namespace")),
        container=s.text(w.get("container", "main"), s.key(path, "container")),
        pid=pid,
        process_name=s.text(w.get("process_name", "python"), s.key(path, "process_name")),
        memory=parse_bytes(w.get("memory", 0), s.key(path, "memory")),
        sm=opt_pattern("sm") or IDLE,
        tensor=opt_pattern("tensor") or IDLE,
        dram=opt_pattern("dram") or IDLE,
        occupancy=opt_pattern("occupancy"),
        utilization=opt_pattern("utilization"),
        memory_reported=s.boolean(w.get("memory_reported", True), s.key(path, "memory_reported")),
        mps=s.boolean(w.get("mps", False), s.key(path, "mps")),
        unrequested=s.boolean(w.get("unrequested", False), s.key(path, "unrequested")),
        reservation=_reservation(w, path),
        deleted=s.boolean(w.get("deleted", False), s.key(path, "deleted")),
    )


def _reservation(w: Mapping[str, Any], path: str) -> str:
    if "reservation" not in w:
        return ""
    where = s.key(path, "reservation")
    value = s.text(w["reservation"], where)
    namespace, _, pod = value.partition("/")
    if not namespace or not pod or "/" in pod:
        raise Invalid(where, f"expected namespace/pod, got {value!r}")
    return value


def _check_pod_keys(w: Mapping[str, Any], path: str) -> None:
    """``host: true`` (a process outside Kubernetes) names no pod; the keys that describe a
    pod's use need one."""
    host = s.boolean(w.get("host", False), s.key(path, "host"))
    for key in ("pod", "unrequested", "reservation", "deleted") if host else ():
        if w.get(key):
            raise Invalid(s.key(path, key), "a host process (host: true) has no pod")
    for key in ("unrequested", "reservation", "deleted") if not w.get("pod") else ():
        if w.get(key):
            raise Invalid(s.key(path, key), "needs a pod")


def _check_unallocated_use(
    workloads: Sequence[WorkloadSpec], allocations: Sequence[AllocationSpec]
) -> None:
    """A pod said to hold nothing of its device holds nothing of it; a reservation is held."""
    held = {(a.namespace, a.pod, a.gpu, a.mig) for a in allocations}
    pods = {(a.namespace, a.pod) for a in allocations}
    for i, w in enumerate(workloads):
        path = s.item("workloads", i)
        if (w.unrequested or w.reservation) and (w.namespace, w.pod, w.gpu, w.mig) in held:
            key = "unrequested" if w.unrequested else "reservation"
            raise Invalid(s.key(path, key), f"pod {w.namespace}/{w.pod} holds this device")
        if w.deleted and (w.namespace, w.pod) in pods:
            raise Invalid(s.key(path, "deleted"), f"pod {w.namespace}/{w.pod} holds a device")
        if w.reservation:
            namespace, _, pod = w.reservation.partition("/")
            if (namespace, pod, w.gpu, w.mig) not in held:
                reason = f"no allocation of this device to {w.reservation}"
                raise Invalid(s.key(path, "reservation"), reason)


def device_memory(gpu: GpuSpec, mig: int | None) -> int:
    """Bytes a workload on (gpu, mig) can use."""
    if mig is not None and gpu.mig is not None:
        return gpu.mig[mig].profile.memory_mib * 2**20
    return (gpu.model.memory_mib - gpu.model.reserved_mib) * 2**20


def _check_memory(workloads: Sequence[WorkloadSpec], gpus: Sequence[GpuSpec]) -> None:
    used: dict[tuple[int, int | None], int] = {}
    for i, w in enumerate(workloads):
        where = (w.gpu, w.mig)
        used[where] = used.get(where, 0) + w.memory
        capacity = device_memory(gpus[w.gpu], w.mig)
        if used[where] > capacity:
            reason = f"workloads need {used[where]} bytes, the device has {capacity}"
            raise Invalid(s.key(s.item("workloads", i), "memory"), reason)


ALLOCATION_KEYS = {
    "gpu",
    "mig",
    "replica",
    "pod",
    "namespace",
    "container",
    "resource",
    "claim",
    "compute_domain_claim",
    "cpu_ids",
    "memory_numa_nodes",
}
_CLAIM_NAME = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"  # a Kubernetes object name (RFC 1123)


def _allocation(raw: Any, path: str, gpus: Sequence[GpuSpec]) -> AllocationSpec:
    a = s.mapping(raw, path, ALLOCATION_KEYS, {"gpu", "pod"})
    gpu, mig = device_of(a, path, gpus)
    return build_allocation(a, path, gpus[gpu], mig)


def build_allocation(
    a: Mapping[str, Any], path: str, gpu: GpuSpec, mig: int | None
) -> AllocationSpec:
    replica = s.integer(a["replica"], s.key(path, "replica"), 0) if "replica" in a else None
    default_resource = "nvidia.com/gpu"
    if mig is not None and gpu.mig is not None:
        default_resource = f"nvidia.com/mig-{gpu.mig[mig].profile.name}"
    claim = _claim(a, path, "claim")
    if claim is not None:
        for key in ("replica", "resource"):
            if key in a:
                reason = "a DRA claim has no device-plugin replica or resource (share the claim)"
                raise Invalid(s.key(path, key), reason)
    domain = _claim(a, path, "compute_domain_claim")
    if domain is not None and claim is None:
        raise Invalid(s.key(path, "compute_domain_claim"), "needs a claim for the GPU too")
    return AllocationSpec(
        gpu=gpu.index,
        mig=mig,
        replica=replica,
        pod=s.text(a["pod"], s.key(path, "pod")),
        namespace=s.text(a.get("namespace", "default"), s.key(path, "namespace")),
        container=s.text(a.get("container", "main"), s.key(path, "container")),
        resource=s.text(a.get("resource", default_resource), s.key(path, "resource")),
        claim=claim,
        compute_domain_claim=domain,
        cpu_ids=s.cpu_ids(a["cpu_ids"], s.key(path, "cpu_ids")) if "cpu_ids" in a else (),
        memory_numa_nodes=_numa_nodes(a, s.key(path, "memory_numa_nodes")),
    )


def _numa_nodes(a: Mapping[str, Any], path: str) -> tuple[int, ...]:
    if "memory_numa_nodes" not in a:
        return ()
    nodes = s.sequence(a["memory_numa_nodes"], path)
    return tuple(sorted({s.integer(n, s.item(path, i), 0, 1023) for i, n in enumerate(nodes)}))


def _check_placement(allocations: Sequence[AllocationSpec], node: NodeSpec, gpu_count: int) -> None:
    """CPU ids and memory NUMA nodes exist on the node's topology, and a container's lists are
    given once (the kubelet lists them per container, not per device)."""
    topology = node_topology(node.topology, gpu_count)
    cpus, numa_nodes = topology.cpus, topology.numa_nodes
    first: dict[tuple[str, str, str], tuple[int, AllocationSpec]] = {}
    for i, allocation in enumerate(allocations):
        path = s.item("allocations", i)
        missing = sorted(set(allocation.cpu_ids) - cpus)
        if missing:
            reason = (
                f"CPU {missing[0]} is not on the node (topology {node.topology} has CPUs"
                f" 0-{max(cpus)})"
            )
            raise Invalid(s.key(path, "cpu_ids"), reason)
        for n in allocation.memory_numa_nodes:
            if n >= numa_nodes:
                reason = (
                    f"NUMA node {n} is not on the node (topology {node.topology} has nodes"
                    f" 0-{numa_nodes - 1})"
                )
                raise Invalid(s.key(path, "memory_numa_nodes"), reason)
        if not (allocation.cpu_ids or allocation.memory_numa_nodes):
            continue
        container = (allocation.namespace, allocation.pod, allocation.container)
        if container not in first:
            first[container] = (i, allocation)
            continue
        earlier, spec = first[container]
        for key in ("cpu_ids", "memory_numa_nodes"):
            mine, theirs = getattr(allocation, key), getattr(spec, key)
            if mine and theirs and mine != theirs:
                reason = (
                    f"container {'/'.join(container)} already lists other {key} at"
                    f" allocations[{earlier}]: give them once"
                )
                raise Invalid(s.key(path, key), reason)


def _claim(a: Mapping[str, Any], path: str, key: str) -> str | None:
    return s.text(a[key], s.key(path, key), _CLAIM_NAME) if key in a else None
