"""The simulated node: GPUs, workloads, allocations and the timeline that changes them."""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import math
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_exporter.simulator.dcgm_host import DcgmHost
from gpu_exporter.simulator.devices import MPS_SERVER_BYTES, Device, GpuDevice, MigDevice, Workload
from gpu_exporter.simulator.drivers import field_layout
from gpu_exporter.simulator.events import parse_events
from gpu_exporter.simulator.injected import Failure, Hang
from gpu_exporter.simulator.kmsg import (
    PROCESS_XIDS,
    XID_TEXT,
    KmsgLog,
    sxid_details,
    sxid_message,
    xid_message,
)
from gpu_exporter.simulator.link_events import LinkEvents
from gpu_exporter.simulator.nvml_records import (
    DOUBLE_BIT_ECC_EVENT,
    NO_INSTANCE,
    SINGLE_BIT_ECC_EVENT,
    XID_EVENT,
    EventSet,
    GpmSample,
    QueuedEvent,
)
from gpu_exporter.simulator.scenario import (
    RECOVERY_ACTIONS,
    AllocationSpec,
    EventSpec,
    Scenario,
    WorkloadSpec,
)
from gpu_exporter.simulator.timeline import Timeline
from gpu_exporter.simulator.topology import default_layout, node_topology

FIRST_PID = 210001


@dataclass(frozen=True)
class Allocation:
    """Who holds a device, as the kubelet would report it (``device_id`` is what it lists)."""

    spec: AllocationSpec
    uuid: str
    device_id: str


# A read integrates its GPU's counters only when they are more than this behind: one round's reads
# come ms apart (GPM samples of a GPU and each MIG instance, fields, energy), and integrating for
# each was most of the simulator's CPU on mig56, on the GIL the event loop needs. GPM samples carry
# the time their counters were integrated to, so rates between samples stay exact.
READ_INTEGRATION_STEP_S = 0.01


class SimulatedNode(DcgmHost, LinkEvents):
    """Simulated GPUs and their timeline; ``library`` is the fake ``libnvidia-ml``."""

    def __init__(
        self,
        scenario: Scenario,
        clock: Callable[[], float] = time.monotonic,
        *,
        epoch: float | None = None,
        wall_origin: float | None = None,
        pid_offset: int = 0,
    ) -> None:
        """``epoch``: the clock reading that is t=0 (default: now). ``wall_origin``: the wall
        time of t=0, for NVML's wall-clock timestamps (default: now). ``pid_offset`` is added to
        every simulated process id (``gpu-exporter-simulate`` moves them above the host's
        ``pid_max``, where no host process can be)."""
        from gpu_exporter.simulator.library import FakeNvmlLibrary  # the library needs this class

        self.scenario = scenario
        self.lock = threading.RLock()
        self.kmsg = KmsgLog(scenario.node.uptime)
        node = scenario.node
        fabric = (uuid.UUID(node.fabric_cluster_uuid).bytes, node.fabric_clique_id)
        self.gpus = [GpuDevice(g, node.name, node.uptime, fabric) for g in scenario.gpus]
        layout = node.topology or default_layout(scenario.gpus[0].model.key)
        self.topology = node_topology(layout, len(self.gpus))
        self.handles: dict[int, Device] = {}
        self.gpu_instances: dict[int, MigDevice] = {}
        self.event_sets: dict[int, EventSet] = {}
        self.gpm_samples: dict[int, GpmSample] = {}
        self.pointed_at: dict[int, Any] = {}
        self.hangs: list[Hang] = []
        self.failures: dict[tuple[str, int | None], Failure] = {}
        self.calls: Counter[str] = Counter()  # NVML C function -> times called
        self.field_requests: Counter[int] = Counter()  # field id -> times asked
        self.field_layout = field_layout(scenario.node.driver_version)
        self.applied: deque[dict[str, Any]] = deque(maxlen=1000)
        self.init_count = 0
        self.closed = threading.Event()
        self._allocations = list(scenario.allocations)
        self.events_applied = 0  # timeline events applied so far: what readers' caches key on
        self._views: tuple[int, list[Allocation]] = (-1, [])  # (events_applied, allocations)
        self.pid_offset = pid_offset
        self._pids = itertools.count(FIRST_PID)
        self._mps_pids: dict[int, int] = {}  # id() of a device -> its MPS server's pid
        self.timeline = Timeline(on_sooner=self._wake_waiters)
        self._index_handles()
        for spec in scenario.workloads:
            self._start_workload(spec, 0.0)
        for event in scenario.timeline:
            self.timeline.schedule(event, event.at or 0.0)
        self._clock = clock
        self._t0 = clock() if epoch is None else epoch
        self.wall_origin = time.time() if wall_origin is None else wall_origin
        self._last = 0.0
        self._integrated = [0.0] * len(self.gpus)  # per GPU: counters are integrated up to here
        self.library = FakeNvmlLibrary(self)
        self.advance()

    # ------------------------------------------------------------------ time

    def now(self) -> float:
        """Seconds of simulated time since the node was built."""
        return max(self._clock() - self._t0, self._last)

    def advance(self, *, integrate: bool = True, gpu: GpuDevice | None = None) -> float:
        """Apply every timeline event whose time has come; returns the current time.

        Counters (activity integrals, energy, clock-event time) are brought up to now unless
        ``integrate`` is false: integration is additive, so callers that only read instantaneous
        values can skip it and the next integrating call catches up exactly. With ``gpu``, only
        that GPU is brought up to now (a read of one device need not integrate all of them).
        """
        t, due = self.now(), self.timeline.next_at()
        if not integrate and (due is None or due > t):
            return t  # every call starts here: nothing due, nothing to integrate, no lock taken
        with self.lock:
            t = self.now()
            for at, event in self.timeline.pop_due(t):
                self._integrate_to(at)  # events change state: everything catches up first
                self._apply(event, at)
                if event.repeat:
                    self.timeline.schedule(event, at + event.repeat)
            if integrate:
                self._integrate_to(t, gpu, step=READ_INTEGRATION_STEP_S)
            return t

    def seconds_until_due(self) -> float:
        """Until the timeline's next event (inf when none); a waiter sleeps at most this long."""
        due = self.timeline.next_at()
        return math.inf if due is None else max(0.0, due - self.now())

    def integrated_at(self, gpu: GpuDevice) -> float:
        return self._integrated[gpu.index]  # the simulated time gpu's counters are brought up to

    def _integrate_to(self, t: float, only: GpuDevice | None = None, step: float = 0.0) -> None:
        for gpu in self.gpus if only is None else (only,):
            since = self._integrated[gpu.index]
            if t - since > step:
                gpu.advance(since, t)
                self._integrated[gpu.index] = t
        self._last = max(self._last, t)

    def _wake_waiters(self) -> None:
        for event_set in list(self.event_sets.values()):
            with event_set.condition:
                event_set.condition.notify_all()

    # ------------------------------------------------------------------ public control

    def inject(self, event: Mapping[str, Any]) -> None:
        """Apply one event now (a timeline entry without ``at``); ScenarioError if invalid."""
        self.inject_many(event, "<inject>")

    def inject_many(self, data: Any, source: str) -> list[dict[str, Any]]:
        """Apply one event or a list of events now; returns what was applied."""
        events = parse_events(data, source, self.scenario.gpus)
        with self.lock:
            t = self.advance()
            for event in events:
                self._apply(event, t)
            return list(itertools.islice(reversed(self.applied), len(events)))[::-1]

    def close(self) -> None:
        """Release every hang and waiting event thread."""
        self.closed.set()
        with self.lock:
            for hang in self.hangs:
                hang.released.set()
        self._wake_waiters()

    @property
    def kmsg_lines(self) -> list[str]:
        """Kernel-log records emitted so far (``/dev/kmsg`` format, no trailing newline)."""
        self.advance(integrate=False)
        return self.kmsg.lines

    def add_kmsg_sink(self, sink: Callable[[str], None]) -> None:
        self.kmsg.add_sink(sink)

    def add_kmsg_file(self, path: Any) -> None:
        self.kmsg.add_file(path)

    @property
    def allocations(self) -> list[Allocation]:
        """Current allocations with the device ids a kubelet would list (events applied; the
        activity counters are not integrated). Kept from one event to the next, so that a read
        takes the node's lock only after one: the simulated kubelet reads them on the event
        loop, where waiting for the lock meant waiting for an NVML call (up to 7 ms)."""
        self.advance(integrate=False)
        applied, views = self._views
        if applied != self.events_applied:
            with self.lock:  # events are applied under it: these views match one count
                views = [self._allocation_view(a) for a in self._allocations]
                self._views = (self.events_applied, views)
        return list(views)

    def _allocation_view(self, spec: AllocationSpec) -> Allocation:
        gpu = self.gpus[spec.gpu]
        uuid = gpu.migs[spec.mig].uuid if spec.mig is not None else gpu.uuid
        device_id = f"{uuid}::{spec.replica}" if spec.replica is not None else uuid
        return Allocation(spec, uuid, device_id)

    # ------------------------------------------------------------------ handles

    def _index_handles(self) -> None:
        for gpu in self.gpus:
            self.handles[ctypes.addressof(gpu.handle)] = gpu
            for mig in gpu.migs:
                self.handles[ctypes.addressof(mig.handle)] = mig
                self.gpu_instances[ctypes.addressof(mig.gi_handle)] = mig

    @property
    def visible_gpus(self) -> list[GpuDevice]:
        """The GPUs NVML enumerates, in index order (a GPU missing at boot is not among them)."""
        return [gpu for gpu in self.gpus if not gpu.missing]

    def device_of(self, handle: Any) -> Device | None:
        """The device behind a ``c_nvmlDevice_t``, or None."""
        try:
            return self.handles.get(ctypes.addressof(handle.contents))
        except (ValueError, TypeError, AttributeError):
            return None

    # ------------------------------------------------------------------ hangs

    def hang_for(self, function: str, gpu: int | None) -> Hang | None:
        with self.lock:
            for hang in self.hangs:
                remaining = hang.remaining()
                if hang.released.is_set() or (remaining is not None and remaining <= 0):
                    continue
                if hang.function in (None, function) and hang.gpu in (None, gpu):
                    return hang
        return None

    # ------------------------------------------------------------------ events

    def _apply(self, event: EventSpec, t: float) -> None:
        handler: Callable[[Mapping[str, Any], float], None] = getattr(self, f"_on_{event.type}")
        handler(event.params, t)
        self.applied.append({"t": round(t, 6), **event.raw})
        self.events_applied += 1

    def _targets(self, params: Mapping[str, Any]) -> Iterable[GpuDevice]:
        return (self.gpus[i] for i in params["gpus"])

    def _on_xid(self, p: Mapping[str, Any], t: float) -> None:
        for gpu in self._targets(p):
            # (an instance index from before a MIG reconfiguration may no longer exist)
            mig = gpu.migs[p["mig"]] if p["mig"] is not None and p["mig"] < len(gpu.migs) else None
            if p["delivery"] in ("kmsg", "both"):
                self.kmsg.emit(self._xid_line(gpu, mig, p), t)
            if p["delivery"] in ("nvml", "both") and not gpu.lost:
                # Per-instance attribution needs root; others get the event unattributed.
                attributed = mig is not None and self.scenario.node.privileged
                gi = mig.spec.gpu_instance_id if mig and attributed else NO_INSTANCE
                ci = 0 if mig and attributed else NO_INSTANCE
                self._deliver(gpu, QueuedEvent(gpu, XID_EVENT, p["code"], gi, ci))

    def _xid_line(self, gpu: GpuDevice, mig: MigDevice | None, p: Mapping[str, Any]) -> str:
        pid, name = p["pid"], p["process_name"]
        if pid is not None:
            pid += self.pid_offset
        if pid is None and p["code"] in PROCESS_XIDS:
            running = mig.workloads if mig else [w for w, _ in gpu.all_workloads()]
            if running:
                pid, name = running[0].pid, name or running[0].spec.process_name
        if pid is not None and name is None:
            name = next(
                (w.spec.process_name for w, _ in gpu.all_workloads() if w.pid == pid), "python"
            )
        text = p["message"] or XID_TEXT.get(p["code"], "Unknown error")
        gi = mig.spec.gpu_instance_id if mig else None
        return xid_message(gpu.bus, p["code"], pid, name, text, gi)

    def _on_sxid(self, p: Mapping[str, Any], t: float) -> None:
        """The report line, then the detail lines the driver adds for a recorded error."""
        switch, code, severity, link = p["switch"], p["code"], p["severity"], p["link"]
        self.kmsg.emit(sxid_message(switch, code, severity, link, p["message"]), t)
        for line in sxid_details(switch, code, severity, link):
            self.kmsg.emit(line, t)

    def _deliver(self, gpu: GpuDevice, event: QueuedEvent) -> None:
        for event_set in list(self.event_sets.values()):
            mask = event_set.masks.get(gpu.index, 0)
            if mask and (event.lost or mask & event.event_type):
                event_set.push(event)

    def _on_gpu_lost(self, p: Mapping[str, Any], t: float) -> None:
        for gpu in self._targets(p):
            if not gpu.lost:
                gpu.lost = True
                self._deliver(gpu, QueuedEvent(gpu, 0, 0, lost=True))

    def _on_gpu_recovered(self, p: Mapping[str, Any], t: float) -> None:
        for gpu in self._targets(p):
            gpu.reset()

    def _on_throttle(self, p: Mapping[str, Any], t: float) -> None:
        for gpu in self._targets(p):
            if p["state"] == "on":
                gpu.throttles.add(p["reason"])
            else:
                gpu.throttles.discard(p["reason"])
        if p["duration"] is not None:
            off = {"gpus": p["gpus"], "reason": p["reason"], "state": "off", "duration": None}
            raw = {
                "type": "throttle",
                "gpu": list(p["gpus"]),
                "reason": p["reason"],
                "state": "off",
            }
            self.timeline.schedule(EventSpec("throttle", off, raw), t + p["duration"])

    def _on_ecc(self, p: Mapping[str, Any], t: float) -> None:
        for gpu in self._targets(p):
            for kind in ("corrected", "uncorrected"):
                gpu.errors.ecc_volatile[kind] += p[kind]
                gpu.errors.ecc_aggregate[kind] += p[kind]
            if p["corrected"]:
                self._deliver(gpu, QueuedEvent(gpu, SINGLE_BIT_ECC_EVENT, 0))
            if p["uncorrected"]:
                self._deliver(gpu, QueuedEvent(gpu, DOUBLE_BIT_ECC_EVENT, 0))

    def _on_row_remap(self, p: Mapping[str, Any], t: float) -> None:
        for gpu in self._targets(p):
            gpu.errors.remapped[p["cause"]] += p["rows"]
            gpu.errors.remap_pending = True

    def _on_row_remap_failure(self, p: Mapping[str, Any], t: float) -> None:
        for gpu in self._targets(p):
            gpu.errors.remap_failure = True

    def _on_retired_pages(self, p: Mapping[str, Any], t: float) -> None:
        for gpu in self._targets(p):
            base = 0x1_0000_0000 + len(gpu.errors.retired) * 0x1000
            for n in range(p["count"]):
                gpu.errors.retired.append((p["cause"], base + n * 0x1000, p["pending"]))

    def _on_recovery_action(self, p: Mapping[str, Any], t: float) -> None:
        for gpu in self._targets(p):
            gpu.recovery_action = RECOVERY_ACTIONS[p["action"]]

    def _on_field_value(self, p: Mapping[str, Any], t: float) -> None:
        for gpu in self._targets(p):
            if p["on"]:
                gpu.field_overrides[p["field"]] = (p["value"], p["value_type"])
            else:
                gpu.field_overrides.pop(p["field"], None)

    def _on_mig_reconfigure(self, p: Mapping[str, Any], t: float) -> None:
        """New MIG instances on one GPU: its instances' workloads and allocations end first."""
        gpu = self.gpus[p["gpu"]]
        self._allocations = [a for a in self._allocations if a.gpu != gpu.index or a.mig is None]
        for mig in gpu.migs:
            self.handles.pop(ctypes.addressof(mig.handle), None)
            self.gpu_instances.pop(ctypes.addressof(mig.gi_handle), None)
        gpu.reconfigure(p["layout"])
        for mig in gpu.migs:
            self.handles[ctypes.addressof(mig.handle)] = mig
            self.gpu_instances[ctypes.addressof(mig.gi_handle)] = mig
        specs = list(self.scenario.gpus)
        specs[gpu.index] = gpu.spec
        self.scenario = dataclasses.replace(self.scenario, gpus=tuple(specs))

    def _on_allocate(self, p: Mapping[str, Any], t: float) -> None:
        self._allocations.append(p["allocation"])
        if p["workload"] is not None:
            self._start_workload(p["workload"], t)

    def _on_release(self, p: Mapping[str, Any], t: float) -> None:
        def matches(pod: str, namespace: str, gpu: int) -> bool:
            same_gpu = p["gpu"] is None or p["gpu"] == gpu
            return pod == p["pod"] and namespace == p["namespace"] and same_gpu

        self._allocations = [a for a in self._allocations if not matches(a.pod, a.namespace, a.gpu)]
        for gpu in self.gpus:
            for device in [gpu, *gpu.migs]:
                device.workloads = [
                    w
                    for w in device.workloads
                    if not matches(w.spec.pod, w.spec.namespace, gpu.index)
                ]

    def _on_workload_start(self, p: Mapping[str, Any], t: float) -> None:
        self._start_workload(p["workload"], t)

    def _on_workload_stop(self, p: Mapping[str, Any], t: float) -> None:
        pid = p["pid"] + self.pid_offset
        for gpu in self.gpus:
            for device in [gpu, *gpu.migs]:
                device.workloads = [w for w in device.workloads if w.pid != pid]

    def _on_hang(self, p: Mapping[str, Any], t: float) -> None:
        deadline = None if p["duration"] is None else time.monotonic() + p["duration"]
        self.hangs.append(Hang(p["function"], p["gpu"], deadline))

    def _on_nvml_error(self, p: Mapping[str, Any], t: float) -> None:
        key = (p["function"], p["gpu"])
        if p["on"]:
            self.failures[key] = Failure(p["code"], p["every"], p["times"])
        else:
            self.failures.pop(key, None)

    def failure_for(self, function: str, gpu: int | None) -> int | None:
        """The error code an injected failure makes this call of ``function`` on ``gpu``
        return, if any (one scoped to the GPU wins over one for any GPU)."""
        with self.lock:
            key = (function, gpu)
            if key not in self.failures:
                key = (function, None)
            failure = self.failures.get(key)
            if failure is None or not failure.strike():
                return None
            if failure.spent:
                del self.failures[key]
            return failure.code

    def _on_unhang(self, p: Mapping[str, Any], t: float) -> None:
        for hang in self.hangs:
            if p["function"] in (None, hang.function) and p["gpu"] in (None, hang.gpu):
                hang.released.set()
        self.hangs = [h for h in self.hangs if not h.released.is_set()]

    # ------------------------------------------------------------------ workloads

    def _start_workload(self, spec: WorkloadSpec, t: float) -> None:
        gpu = self.gpus[spec.gpu]
        device: GpuDevice | MigDevice = gpu.migs[spec.mig] if spec.mig is not None else gpu
        pid = spec.pid if spec.pid is not None else next(self._pids)
        device.workloads = (*device.workloads, Workload(spec, pid + self.pid_offset, t))

    def mps_servers(self, device: Device) -> list[tuple[int, int, MigDevice | None]]:
        """(pid, memory, MIG instance) of the MPS control server on each of ``device``'s
        schedulable devices (itself, or its MIG instances) that has MPS clients."""
        served = device.migs if isinstance(device, GpuDevice) and device.mig_enabled else [device]
        servers = []
        for each in served:
            if any(w.spec.mps for w in each.workloads):
                if id(each) not in self._mps_pids:
                    self._mps_pids[id(each)] = next(self._pids) + self.pid_offset
                mig = each if isinstance(each, MigDevice) else None
                servers.append((self._mps_pids[id(each)], MPS_SERVER_BYTES, mig))
        return servers
