"""Whose each GPU process is, and what it does: the process scan and the per-process activity
reads, run on the worker pool and applied on the event loop.

A scan (:func:`~.processes.scan`, on a worker thread, every ``process_interval``) lists every
GPU process with its pod UID and the pod log directories' names. :meth:`ProcessOwners.apply`
then classes each process against its device's holders
(:mod:`.unseen`: a pod running on a device it holds nothing of is a ``source="process"`` holder,
what runs in no pod or a gone one is summed apart), given its container, and its memory summed
per container for ``gpu_container_memory_used_bytes``. On a Slurm node a process belongs to the
job its cgroup or environment names (:mod:`.jobprocs`) instead, and one outside any job is
skipped like a host process.

A PID seen in a pod is remembered :data:`PID_RETENTION` seconds: events are attributed to it
(its process may have died in the very fault being attributed), and per-process utilisation
samples (:meth:`ProcessOwners.read_activity`, every ``poll_interval``) are summed to its
container (:mod:`.process_activity`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import MappingProxyType

from ..devices import Device, DeviceId
from ..nvml import WorkerPool
from .cgroups import PodName
from .jobprocs import read_process_jobs
from .model import Allocations, Holding, PodKey
from .pool_jobs import PoolJob
from .process_activity import ContainerActivity, Owner, ProcessSample
from .processes import ComputeModeReader, ProcessLister, ScanResult, scan
from .unseen import (
    UNATTRIBUTED,
    ClassifiedProcess,
    UnattributedMemory,
    classify,
    observed_holdings,
    unattributed_owner,
)

PID_RETENTION = 600.0
# (device, namespace, pod, container) -> the used bytes of each of its processes
MemoryUse = dict[tuple[DeviceId, str, str, str], list[int | None]]


# NVML's per-process utilisation samples of one device; None where it has none
UtilizationRead = Callable[[Device], list[ProcessSample] | None]


class ProcessOwners:
    """``job_node``: processes belong to Slurm jobs, not pods. The scan and the activity read
    run as ``scan`` and ``activity`` on ``pool``; ``lister``, ``compute_mode`` and
    ``utilization`` are the NVML reads they make."""

    def __init__(
        self,
        pool: WorkerPool,
        *,
        proc_path: Path,
        pod_logs_path: Path,
        scan: PoolJob,
        activity: PoolJob,
        lister: ProcessLister,
        compute_mode: ComputeModeReader,
        utilization: UtilizationRead,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        job_node: bool = False,
    ) -> None:
        self._pool = pool
        self._proc_path = proc_path
        self._pod_logs_path = pod_logs_path
        self._scan, self._activity_read = scan, activity
        self._lister = lister
        self._compute_mode = compute_mode
        self._utilization = utilization
        self._clock = clock
        self._wall_clock = wall_clock
        self._job_node = job_node
        # Per-container activity integrals (the accountant's per-pod rule on shared devices).
        self.activity = ContainerActivity(kept=[unattributed_owner(c) for c in UNATTRIBUTED])
        self.pod_names: dict[str, PodName] = {}  # pod UID -> names, from the pod log directories
        # Each PID seen in a pod: its container, and the wall time of the last scan that saw it.
        self._pids: dict[int, Owner] = {}
        self._pids_seen: dict[int, float] = {}
        self._unattributed_pids: dict[int, str] = {}  # PID -> its class, for activity
        # Every GPU process of the last scan, classed; the pods seen only through their processes.
        self.classified: tuple[ClassifiedProcess, ...] = ()
        self.observed: list[Holding] = []
        self.unattributed = UnattributedMemory()
        self.memory: MemoryUse = {}
        self.mps: set[str] = set()  # uuids with MPS clients
        self.compute_modes: dict[str, int] = {}
        self.by_pid: Mapping[int, PodKey] = MappingProxyType({})
        self._holders: _ContainerIndex | None = None  # of the allocations the last scan saw

    async def scan(
        self, devices: Iterable[Device], allocations: Allocations
    ) -> tuple[ScanResult, dict[int, str] | None] | None:
        """One scan of ``devices`` (the job and PID -> job id on a Slurm node); None while an
        earlier scan is stuck (an NVML call hung: threads do not pile up) or none finished."""
        if self._scan.stuck:
            return None
        job = partial(
            scan,
            [d for d in devices if d.id.is_mig or d.id.mig_mode != "enabled"],
            self._lister,
            self._proc_path,
            self._pod_logs_path,
            set(self.pod_names),
            self._compute_mode,
            self.held_pod_uids(allocations),
            {(p.device.uuid, p.process.pid): p.process for p in self.classified},
        )
        if self._job_node:
            return await self._scan.run(self._pool, partial(_scan_jobs, job, self._proc_path))
        result = await self._scan.run(self._pool, job)
        return None if result is None else (result, None)

    async def read_activity(self, devices: Iterable[Device]) -> bool | None:
        """New per-process utilisation samples of ``devices``' whole GPUs, summed per container;
        whether a device's holders got their first own samples (their idle rule changes). None
        when no read finished."""
        sampled = [d for d in devices if not d.id.is_mig and d.id.mig_mode != "enabled"]
        if self._activity_read.stuck:
            return None
        job = partial(_read_samples, sampled, self._utilization)
        result = await self._activity_read.run(self._pool, job)
        if result is None:
            return None
        before = self._signalled(device for device, _ in result)
        now, wall_now = self._clock(), self._wall_clock()
        for device, samples in result:
            self.activity.add(device, samples, self.owner_of, now=now, wall_now=wall_now)
        return self._signalled(device for device, _ in result) != before

    def _signalled(self, devices: Iterable[DeviceId]) -> frozenset[str]:
        return frozenset(d.uuid for d in devices if self.activity.until(d.uuid) is not None)

    def apply(
        self,
        result: ScanResult,
        allocations: Allocations,
        listed: frozenset[PodKey] | None,
        jobs: Mapping[int, str] | None = None,
    ) -> bool:
        """``listed``: the pods the kubelet lists, None while it does not answer (then every
        pod a log directory names counts as listed: none is called gone on a kubelet outage, and
        no process as not held). ``jobs``: on a Slurm node, PID -> job id. Whether what the
        series show of the processes changed (classes, memory, MPS clients, compute modes)."""
        if result.pods:
            self.pod_names = result.pods
        now = self._wall_clock()
        mps = {p.device.uuid for p in result.processes if p.mps}
        modes_changed = (mps, result.compute_modes) != (self.mps, self.compute_modes)
        if modes_changed:
            self.mps, self.compute_modes = mps, result.compute_modes
        memory: MemoryUse = {}
        if self._holders is None or self._holders.allocations is not allocations:
            self._holders = _ContainerIndex(allocations)
        holders = self._holders
        held = None  # unknown until the kubelet answers
        if listed is not None:
            held = holders.held
        else:
            listed = frozenset((n.namespace, n.pod) for n in self.pod_names.values())
        classified: list[ClassifiedProcess] = []
        self._unattributed_pids = {}
        for process in result.processes:
            if jobs is not None:
                job_id = jobs.get(process.pid)
                if job_id is not None:
                    self._saw(process.pid, ("", job_id, ""), now)
                    memory.setdefault((process.device, "", job_id, ""), []).append(
                        process.used_bytes
                    )
                continue
            process_class, pod = classify(process, self.pod_names, listed, held)
            names = self.pod_names.get(process.owner.pod_uid) if process.owner else None
            if pod is None or names is None or process_class in UNATTRIBUTED:
                self._unattributed_pids[process.pid] = process_class
                classified.append(ClassifiedProcess(process, process_class, pod))
                continue
            container = holders.container(process.device, pod, names)
            classified.append(ClassifiedProcess(process, process_class, pod, container))
            self._saw(process.pid, (*pod, container), now)
            key = (process.device, *pod, container)
            memory.setdefault(key, []).append(process.used_bytes)
        self._forget_pids(now)
        return self._publish_scan(classified, memory) or modes_changed

    def _saw(self, pid: int, owner: Owner, now: float) -> None:
        if self._pids.get(pid) != owner:
            self._pids[pid] = owner
        self._pids_seen[pid] = now

    def _forget_pids(self, now: float) -> None:
        expired = [pid for pid, seen in self._pids_seen.items() if now - seen >= PID_RETENTION]
        for pid in expired:
            del self._pids[pid], self._pids_seen[pid]

    def _publish_scan(self, classified: list[ClassifiedProcess], memory: MemoryUse) -> bool:
        """Keep what the scan shows, reusing the last scan's objects where they did not change;
        whether the processes' classes or memory changed.

        A scan's state lives until the next scan, long enough for the garbage collector to move
        it to its old generation; rebuilding an equal one every scan would fill that generation
        (and bring on full collections, which stall the event loop) with nothing new."""
        known = {(p.device.uuid, p.process.pid): p for p in self.classified}
        scanned = tuple(_as_before(known, p) for p in classified)
        changed = (scanned, memory) != (self.classified, self.memory)
        if changed:
            self.classified, self.memory = scanned, memory
            self.observed = observed_holdings(scanned)
            self.unattributed.update(scanned)
        by_pid = {pid: owner[:2] for pid, owner in self._pids.items()}
        if by_pid != self.by_pid:
            self.by_pid = MappingProxyType(by_pid)
        return changed

    def owner_of(self, pid: int) -> Owner | None:
        """The container a PID ran in, or its unattributed class (per-process activity)."""
        owner = self._pids.get(pid)
        if owner is not None:
            return owner
        process_class = self._unattributed_pids.get(pid)
        return None if process_class is None else unattributed_owner(process_class)

    def held_pod_uids(self, allocations: Allocations) -> frozenset[tuple[str, str]]:
        """(device uuid, pod UID) of every holding whose pod UID is known: the scan reads the
        command name of every other process (for the status page) and of none of these."""
        uids = {(n.namespace, n.pod): uid for uid, n in self.pod_names.items()}
        holdings = allocations.holdings
        return frozenset((h.device.uuid, uids[h.pod_key]) for h in holdings if h.pod_key in uids)

    def observed_now(self, allocations: Allocations) -> list[Holding]:
        """The last scan's process-only holders that still hold no allocation of their device."""
        held = {(h.device.uuid, h.pod_key) for h in allocations.holdings}
        return [h for h in self.observed if (h.device.uuid, h.pod_key) not in held]


def _as_before(
    known: Mapping[tuple[str, int], ClassifiedProcess], process: ClassifiedProcess
) -> ClassifiedProcess:
    """The last scan's object for ``process`` (same device and PID) if it is equal to it."""
    before = known.get((process.device.uuid, process.process.pid))
    return before if before == process else process


def _scan_jobs(
    scan_job: Callable[[], ScanResult], proc_path: Path
) -> tuple[ScanResult, dict[int, str] | None]:
    """A process scan, and the job each of its processes runs in (worker thread)."""
    result = scan_job()
    return result, read_process_jobs(proc_path, {p.pid for p in result.processes})


def _read_samples(
    devices: Sequence[Device], reader: UtilizationRead
) -> list[tuple[DeviceId, list[ProcessSample]]]:
    """New samples per device that has the signal (worker thread); a failing device is skipped."""
    found: list[tuple[DeviceId, list[ProcessSample]]] = []
    for device in devices:
        try:
            samples = reader(device)
        except Exception:  # DeviceLost included: the sampler handles the GPU itself
            continue
        if samples is not None:
            found.append((device.id, samples))
    return found


class _ContainerIndex:
    """Which containers hold what, indexed once per allocations (scans in between reuse it): a
    scan looks up every GPU process (hundreds on a MIG node), and searching the holdings for
    each was quadratic (7 ms on the event loop for 500 processes on 56 instances)."""

    def __init__(self, allocations: Allocations) -> None:
        self.allocations = allocations
        self.held = frozenset((h.device.uuid, h.pod_key) for h in allocations.holdings)
        self._by_device: dict[tuple[str, PodKey], set[str]] = {}
        self._by_pod: dict[PodKey, set[str]] = {}
        for h in allocations.holdings:
            self._by_device.setdefault((h.device.uuid, h.pod_key), set()).add(h.container)
            self._by_pod.setdefault(h.pod_key, set()).add(h.container)

    def container(self, device: DeviceId, pod: PodKey, names: PodName) -> str:
        """The container a pod's process belongs to: the one holding the device, if unique;
        else the pod's one holder of any device, else the pod's one container."""
        for candidates in (
            self._by_device.get((device.uuid, pod), ()),
            self._by_pod.get(pod, ()),
            names.containers,
        ):
            if len(set(candidates)) == 1:
                return next(iter(candidates))
        return ""
