"""What the status page shows, built from the rendered series (metric names are the contract).

Each row is a GPU or a MIG instance. A family the exporter does not serve on this node (no GPM,
no NVLink, no allocation source) leaves its cells empty: the page never invents a value.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .reader import Labels, Series

# Reasons that lower clocks by design rather than throttle a busy GPU.
NOT_THROTTLING = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting"})
RECENT_XIDS = 20


@dataclass(frozen=True)
class Holder:
    """A container that holds the device, with what its own processes do where that is known."""

    namespace: str
    pod: str
    container: str
    resource: str
    sm_active: float | None = None
    memory_used_bytes: float | None = None
    idle_seconds: float | None = None
    source: str = ""  # pod-resources, dra, or process: it runs there holding no allocation
    # Placement (docs/allocation.md): the pod's weakest path between its GPUs and the best the
    # node had ("" for a pod of one GPU), the share of the container's CPUs on this GPU's NUMA
    # node (None: the kubelet lists no CPU ids), and the share of the pod's held time in each SM
    # activity band, low/mid/high (None: no band signal).
    path: str = ""
    best_path: str = ""
    numa_aligned: float | None = None
    sm_bands: SmBands | None = None


@dataclass(frozen=True)
class UnheldProcess:
    """A GPU process whose pod does not hold the device (``process_class``: not_held, no_pod or
    gone; docs/allocation.md), with the kernel's command name: shown here, never a label."""

    pid: int
    process_class: str
    command: str
    namespace: str = ""  # the pod, where a log directory still names it
    pod: str = ""
    memory_used_bytes: float | None = None


@dataclass(frozen=True)
class SmBands:
    low: float
    mid: float
    high: float


@dataclass(frozen=True)
class Health:
    up: bool
    drain_reasons: tuple[str, ...] = ()
    row_remap_pending: bool = False
    row_remap_failed: bool = False
    uncorrected_ecc: float = 0.0
    recovery_action: str = ""

    @property
    def ok(self) -> bool:
        return self.up and not (
            self.drain_reasons
            or self.row_remap_pending
            or self.row_remap_failed
            or self.uncorrected_ecc
            or self.recovery_action
        )


@dataclass(frozen=True)
class Interconnect:
    nvlink_active: int | None = None
    nvlink_links: int | None = None
    pcie_generation: float | None = None
    pcie_max_generation: float | None = None
    pcie_width: float | None = None
    pcie_max_width: float | None = None


@dataclass(frozen=True)
class DeviceStatus:
    gpu: str
    uuid: str
    kind: str  # "gpu" or "mig"
    model: str
    health: Health
    parent_uuid: str = ""
    mig_profile: str = ""
    gpu_instance_id: str = ""
    mig_instances: int = 0  # on a MIG-enabled GPU: how many instances it is split into
    sm_active: float | None = None
    tensor_active: float | None = None
    utilization: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    temperature_celsius: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    allocated: bool | None = None
    sharing: str = ""
    holders: tuple[Holder, ...] = ()
    interconnect: Interconnect = field(default_factory=Interconnect)
    processes: tuple[UnheldProcess, ...] = ()  # what runs on it without holding it

    @property
    def idle_allocated(self) -> bool:
        """Held, and every holder idle right now (its idle streak runs)."""
        return bool(self.holders) and all(h.idle_seconds for h in self.holders)


@dataclass(frozen=True)
class XidRow:
    """An Xid code on a GPU: when it last came, how often, what it means and whom it hit."""

    timestamp: float
    gpu: str
    uuid: str
    xid: str
    xid_class: str
    action: str
    count: float
    pods: tuple[str, ...]


@dataclass(frozen=True)
class NodeStatus:
    version: str
    driver_version: str
    ready: bool
    healthy: bool
    problems: tuple[str, ...]
    sources: dict[str, bool]
    devices: tuple[DeviceStatus, ...]
    xids: tuple[XidRow, ...]


def build_status(
    series: Series,
    *,
    version: str,
    ready: bool,
    healthy: bool,
    problems: tuple[str, ...],
    processes: Mapping[str, tuple[UnheldProcess, ...]] | None = None,
) -> NodeStatus:
    """``processes``: each device's (by uuid) GPU processes that do not hold it."""
    build = series.of("gpu_exporter_build_info")
    return NodeStatus(
        version=version,
        driver_version=build[0][0].get("driver_version", "") if build else "",
        ready=ready,
        healthy=healthy,
        problems=problems,
        sources={
            labels["source"]: value == 1 for labels, value in series.of("gpu_exporter_source_up")
        },
        devices=_devices(series, processes or {}),
        xids=_xids(series),
    )


def _devices(
    series: Series, processes: Mapping[str, tuple[UnheldProcess, ...]]
) -> tuple[DeviceStatus, ...]:
    rows: list[DeviceStatus] = []
    known: set[str] = set()
    for labels, _ in series.of("gpu_info"):
        rows.append(_device(series, labels, "gpu", labels.get("model", "")))
        known.add(labels["uuid"])
    instances: dict[str, int] = defaultdict(int)
    for labels, _ in series.of("gpu_mig_info"):
        rows.append(_device(series, labels, "mig", labels.get("mig_profile", "")))
        known.add(labels["uuid"])
        instances[labels.get("parent_uuid", "")] += 1
    rows = [
        replace(row, mig_instances=instances[row.uuid], processes=processes.get(row.uuid, ()))
        for row in rows
    ]
    for labels, value in series.of("gpu_up"):  # lost GPUs keep only gpu_up
        if labels.get("uuid", "") not in known and value == 0:
            rows.append(
                DeviceStatus(
                    labels["gpu"], labels.get("uuid", ""), "gpu", "", _health(series, labels)
                )
            )
    return tuple(sorted(rows, key=_order))


def _order(row: DeviceStatus) -> tuple[int, int, int, str]:
    index = int(row.gpu) if row.gpu.isdigit() else 1 << 30
    instance = int(row.gpu_instance_id) if row.gpu_instance_id.isdigit() else -1
    return index, row.kind == "mig", instance, row.uuid


def _device(series: Series, labels: Labels, kind: str, model: str) -> DeviceStatus:
    uuid = labels["uuid"]

    def value(name: str, **match: str) -> float | None:
        return _value(series, name, uuid, **match)

    allocated = value("gpu_allocated")
    return DeviceStatus(
        gpu=labels["gpu"],
        uuid=uuid,
        kind=kind,
        model=model,
        parent_uuid=labels.get("parent_uuid", ""),
        mig_profile=labels.get("mig_profile", ""),
        gpu_instance_id=labels.get("gpu_instance_id", ""),
        health=_health(series, labels),
        sm_active=value("gpu_sm_active_ratio"),
        tensor_active=value("gpu_tensor_active_ratio"),
        utilization=value("gpu_utilization_ratio"),
        memory_used_bytes=value("gpu_memory_used_bytes"),
        memory_total_bytes=value("gpu_memory_total_bytes"),
        power_watts=value("gpu_power_watts"),
        power_limit_watts=value("gpu_power_limit_watts"),
        temperature_celsius=value("gpu_temperature_celsius", sensor="gpu"),
        throttle_reasons=_throttle_reasons(series, uuid),
        allocated=None if allocated is None else allocated == 1,
        sharing=_sharing(series, uuid),
        holders=_holders(series, uuid),
        interconnect=_interconnect(series, uuid),
    )


def _value(series: Series, name: str, uuid: str, **match: str) -> float | None:
    for labels, value in series.of_device(name, uuid):
        if all(labels.get(k) == v for k, v in match.items()):
            return value
    return None


def _health(series: Series, labels: Labels) -> Health:
    uuid = labels.get("uuid", "")
    up = _value(series, "gpu_up", uuid)
    drains = tuple(
        sorted(
            lab["reason"]
            for lab, value in series.of_device("gpu_drain_recommended", uuid)
            if lab.get("gpu") == labels["gpu"] and value == 1
        )
    )
    actions = [
        lab["action"]
        for lab, value in series.of_device("gpu_recovery_action", uuid)
        if value == 1 and lab.get("action") != "none"
    ]
    return Health(
        up=up != 0 if up is not None else True,
        drain_reasons=drains,
        row_remap_pending=_value(series, "gpu_row_remap_pending", uuid) == 1,
        row_remap_failed=_value(series, "gpu_row_remap_failed", uuid) == 1,
        uncorrected_ecc=_value(
            series, "gpu_ecc_errors_total", uuid, type="uncorrected", counter="volatile"
        )
        or 0.0,
        recovery_action=actions[0] if actions else "",
    )


def _throttle_reasons(series: Series, uuid: str) -> tuple[str, ...]:
    return tuple(
        labels["reason"]
        for labels, value in series.of_device("gpu_clocks_event_active", uuid)
        if value == 1 and labels["reason"] not in NOT_THROTTLING
    )


def _sharing(series: Series, uuid: str) -> str:
    for labels, value in series.of_device("gpu_sharing_info", uuid):
        if value == 1:
            return labels.get("mode", "")
    return ""


def _holders(series: Series, uuid: str) -> tuple[Holder, ...]:
    per_container = _per_container(series, uuid)
    idle = {
        (lab["namespace"], lab["pod"]): value
        for lab, value in series.of_device("gpu_allocation_idle_streak_seconds", uuid)
    }
    paths = {
        (lab["namespace"], lab["pod"]): (lab.get("path", ""), lab.get("best_path", ""))
        for lab, _ in series.of("gpu_allocation_path_info")
    }
    numa = {
        (lab["namespace"], lab["pod"], lab["container"]): value
        for lab, value in series.of_device("gpu_allocation_numa_aligned_ratio", uuid)
    }
    bands = _bands(series, uuid)
    holders = []
    for labels, _ in series.of_device("gpu_allocation_info", uuid):
        key = (labels["namespace"], labels["pod"], labels["container"])
        sm_active, memory = per_container.get(key, (None, None))
        holders.append(
            Holder(
                namespace=key[0],
                pod=key[1],
                container=key[2],
                resource=labels.get("resource", ""),
                sm_active=sm_active,
                memory_used_bytes=memory,
                idle_seconds=idle.get(key[:2]),
                source=labels.get("source", ""),
                path=paths.get(key[:2], ("", ""))[0],
                best_path=paths.get(key[:2], ("", ""))[1],
                numa_aligned=numa.get(key),
                sm_bands=bands.get(key[:2]),
            )
        )
    return tuple(sorted(holders, key=lambda h: (h.namespace, h.pod, h.container)))


def _bands(series: Series, uuid: str) -> dict[tuple[str, str], SmBands]:
    """Each pod's share of its held time in each SM activity band, from the counters' totals."""
    seconds: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for labels, value in series.of_device("gpu_allocation_sm_activity_band_seconds_total", uuid):
        seconds[(labels["namespace"], labels["pod"])][labels.get("band", "")] = value
    shares = {}
    for pod, by_band in seconds.items():
        total = sum(by_band.values())
        if total > 0:
            low, mid, high = (by_band.get(b, 0.0) / total for b in ("low", "mid", "high"))
            shares[pod] = SmBands(low, mid, high)
    return shares


def _per_container(
    series: Series, uuid: str
) -> dict[tuple[str, str, str], tuple[float | None, float | None]]:
    found: dict[tuple[str, str, str], list[float | None]] = defaultdict(lambda: [None, None])
    for slot, name in enumerate(
        ("gpu_container_sm_active_ratio", "gpu_container_memory_used_bytes")
    ):
        for labels, value in series.of_device(name, uuid):
            key = (labels["namespace"], labels["pod"], labels["container"])
            found[key][slot] = value
    return {key: (pair[0], pair[1]) for key, pair in found.items()}


def _interconnect(series: Series, uuid: str) -> Interconnect:
    active = _value(series, "gpu_nvlink_links", uuid)
    # The links that are down are named one by one (gpu_nvlink_link_active at 0).
    down = sum(1 for _, up in series.of_device("gpu_nvlink_link_active", uuid) if up == 0)
    return Interconnect(
        nvlink_active=None if active is None else int(active),
        nvlink_links=None if active is None else int(active) + down,
        pcie_generation=_value(series, "gpu_pcie_link_generation", uuid),
        pcie_max_generation=_value(series, "gpu_pcie_link_max_generation", uuid),
        pcie_width=_value(series, "gpu_pcie_link_width_lanes", uuid),
        pcie_max_width=_value(series, "gpu_pcie_link_max_width_lanes", uuid),
    )


def _xids(series: Series) -> tuple[XidRow, ...]:
    """Newest first: one row per (GPU, code), from its last timestamp, with the count, the
    catalog action and the pods it was attributed to summed over the per-pod counters."""
    counts: dict[tuple[str, str, str], float] = defaultdict(float)
    pods: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    actions: dict[tuple[str, str, str], str] = {}
    for labels, value in series.of("gpu_xid_errors_total"):
        key = _xid_key(labels)
        counts[key] += value
        actions.setdefault(key, labels.get("action", ""))
        if labels.get("pod"):
            pods[key].add(f"{labels.get('namespace', '')}/{labels['pod']}")
        elif labels.get("job_id"):  # a Slurm node's holder
            pods[key].add(f"job {labels['job_id']}")
    rows = []
    for labels, timestamp in series.of("gpu_xid_last_timestamp_seconds"):
        key = _xid_key(labels)
        rows.append(
            XidRow(
                timestamp=timestamp,
                gpu=key[0],
                uuid=key[1],
                xid=key[2],
                xid_class=labels.get("class", ""),
                action=actions.get(key, ""),
                count=counts.get(key, 0.0),
                pods=tuple(sorted(pods.get(key, ()))),
            )
        )
    rows.sort(key=lambda row: row.timestamp, reverse=True)
    return tuple(rows[:RECENT_XIDS])


def _xid_key(labels: Labels) -> tuple[str, str, str]:
    return labels.get("gpu", ""), labels.get("uuid", ""), labels.get("xid", "")
