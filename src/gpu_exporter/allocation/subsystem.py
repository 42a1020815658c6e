"""Allocation against activity: who holds each device, what it does, and the idle time it wastes.

Three background loops feed series the sampler renders (this is a SampleSource):

- *poll* (every ``poll_interval``): the kubelet's pod-resources ``List`` (gRPC by grpclib,
  :mod:`.channel`), and ``GetAllocatableResources`` when due (see :mod:`.podresources`: when
  ``List`` or the devices changed, else every ``allocatable_interval``), each call with a
  deadline; while containers hold DRA devices of ``gpu.nvidia.com``, the CDI spec directories
  and ``mig-minors`` too (on a worker thread, see :mod:`.cdi` and :mod:`.dra`). While the socket
  is absent or failing, ``gpu_exporter_source_up{source="pod_resources"}`` is 0 and every
  allocation series is withheld (unknown is not zero); the next successful poll brings them
  back. A poll that sees the holders change accounts and publishes at once.
- *account* (after each fast sampling round, :meth:`round_done`, when the app wires the subsystem
  to the sampler with ``update_interval=None``; else every ``update_interval``): allocated and
  idle-allocated seconds per device and pod (see :mod:`.accounting`) and the holder history used
  to attribute events (:meth:`holder`). Driven by the rounds, each accounting step sees exactly
  one new ledger interval per device, and what it publishes is in that round's exposition.
- *processes* (every ``process_interval``): GPU processes (NVML, on a worker thread) to their
  pods and containers through the host's ``/proc`` and pod log directories, for
  ``gpu_container_memory_used_bytes``, PID-based attribution, MPS clients and compute modes;
  each process classed against its device's holders (:mod:`.unseen`): a pod running on a device
  it holds nothing of is a ``source="process"`` holder, what runs in no pod or a gone one is
  summed in ``gpu_unattributed_*``.
- *activity* (every ``poll_interval``, with *processes*): per-process utilisation samples (NVML,
  on a worker thread) summed per container (:mod:`.process_activity`), for
  ``gpu_container_sm_active_*`` and the per-pod idle rule on shared devices.

A poll that changes the holdings (or the devices, or the kubelet's CPU assignments), and the
first one, also reads the node's topology (NVML, on a worker thread, bounded like the scan) and
places each holder (:mod:`.placement`): the paths and NUMA series read that snapshot until the
next change.

Nothing here runs on the scrape path: :meth:`samples` returns the list built from the last state,
rebuilt (at the render that reads it) only after something changed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from ..config import Config
from ..devices import Device, DeviceId
from ..exposition import Family, Sample, label_string
from ..families import SOURCE_UP
from ..ledger import ActivityLedger
from ..logs import RateLimitedLog, get_logger
from ..migprofiles import MigProfileBook
from ..nvml import CallTimedOut, ErrorCounter, PoolExhausted, WorkerPool
from ..ticks import ticks
from .accounting import IdleAccountant
from .cdi import CdiIndex, CdiReader
from .cgroups import PodName
from .dra import GPU_DRIVER
from .history import HolderHistory, HolderSnapshot
from .jobgpus import JobGpus, JobHolding, JobSource, SlurmError, resolve
from .jobprocs import read_process_jobs
from .metrics import FAMILIES, FOLDED, SOURCE_TRANSITIONS, holder_labels, job_labels
from .model import Allocations, Holding, PodKey, resolve_snapshot
from .placement import PlacementRead, PlacementReader, PlacementSnapshot
from .podresources import Folded, PodResourcesClient, PodResourcesError, PodResourcesSnapshot
from .process_activity import ContainerActivity, Owner, ProcessSample, ProcessUtilizationReader
from .processes import ComputeModeReader, NvmlProcessLister, ProcessLister, ScanResult, scan
from .rightsizing import FAMILIES as RIGHTSIZING_FAMILIES
from .rightsizing import RightSizer
from .samples import (
    UNKNOWN_DEVICE_ID,
    HolderLabels,
    UnresolvedCounts,
    activity_samples,
    allocation_samples,
    job_info_samples,
    memory_samples,
    placement_samples,
    sharing_samples,
    unattributed_samples,
)
from .unseen import (
    UNATTRIBUTED,
    ClassifiedProcess,
    UnattributedMemory,
    classify,
    observed_holdings,
    unattributed_owner,
)

T = TypeVar("T")
_log = get_logger("allocation")
_POD_RESOURCES = label_string({"source": "pod_resources"})
_SLURM = label_string({"source": "slurm"})
SLURM_RESOURCE = "slurm"  # a job holding's resource (no gpu_allocation_info is published for it)
_FOLDED_IDS = label_string({"what": "device_ids"})
_FOLDED_HOLDERS = label_string({"what": "holders"})
# A PID seen in a pod is remembered this long for attributing events to it (its process may have
# died in the very fault being attributed).
PID_RETENTION = 600.0
# A kubelet's grpc-message is quoted this far in the log (escaped): it is the kubelet's text.
REASON_CHARS = 200


@dataclass(frozen=True)
class _PidOwner:
    pod: PodKey
    seen: float  # wall time
    container: str = ""


class AllocationSubsystem:
    families: Sequence[Family] = (*FAMILIES, *RIGHTSIZING_FAMILIES, SOURCE_UP)

    def __init__(
        self,
        *,
        socket_path: Path,
        devices: Callable[[], Iterable[Device]],
        ledger: ActivityLedger,
        executor: WorkerPool,
        idle_threshold: float = Config.idle_threshold,
        proc_path: Path = Config.proc_path,
        pod_logs_path: Path = Config.pod_logs_path,
        cdi_spec_dirs: Sequence[Path] = Config.cdi_spec_dirs,
        mig_minors_path: Path = Config.nvidia_caps_path / "mig-minors",
        self_pod: PodKey | None = None,
        poll_interval: float = Config.pod_resources_interval,
        update_interval: float | None = 0.5,
        process_interval: float | None = 5.0,
        call_timeout: float = 2.0,
        allocatable_interval: float = 30.0,
        process_lister: ProcessLister | None = None,
        utilization_reader: Callable[[Device], list[ProcessSample] | None] | None = None,
        errors: ErrorCounter | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        mig_profiles: MigProfileBook | None = None,
        jobs: JobSource | None = None,
        sysfs_path: Path | None = None,
        placement_reader: PlacementRead | None = None,
    ) -> None:
        """``jobs``: a Slurm source (:mod:`.slurm`, :mod:`.jobmap`) instead of the kubelet,
        read on ``executor`` every ``poll_interval`` within ``call_timeout``; a holder is then
        ("", job id), and its series are labelled ``job_id`` (docs/slurm.md)."""
        self._client = PodResourcesClient(
            socket_path,
            timeout=call_timeout,
            allocatable_interval=allocatable_interval,
            clock=clock,
        )
        self._devices = devices
        self._executor = executor
        self._proc_path = proc_path
        self._pod_logs_path = pod_logs_path
        self._cdi_reader = CdiReader(tuple(cdi_spec_dirs), mig_minors_path)
        self._cdi = CdiIndex()
        self._self_pod = self_pod
        self._unresolved = UnresolvedCounts()
        self._intervals = (poll_interval, update_interval, process_interval)
        self._scan_timeout = max(call_timeout, 5.0)
        self._lister = process_lister or NvmlProcessLister(errors)
        self._compute_mode = ComputeModeReader(errors)
        self._reader = utilization_reader or ProcessUtilizationReader(errors)
        self._activity = ContainerActivity(kept=[unattributed_owner(c) for c in UNATTRIBUTED])
        self._placement_reader = placement_reader or PlacementReader(sysfs_path, errors)
        self._placement = PlacementSnapshot()
        self._placed_from: object = None  # what self._placement was made from
        self._mps: set[str] = set()  # uuids with MPS clients at the last scan
        self._compute_modes: dict[str, int] = {}
        self._clock = clock
        self._wall_clock = wall_clock
        # A finished job's counters leave within one poll (issue 38); a pod's stay for a scrape.
        retention = {} if jobs is None else {"retention": poll_interval}
        self._accountant = IdleAccountant(ledger, idle_threshold, pods=self._activity, **retention)
        self._jobs = jobs
        self._job_answer: JobGpus | None = None
        self._job_holdings: tuple[JobHolding, ...] = ()
        self._job_timeout = call_timeout
        self._source_labels = _POD_RESOURCES if jobs is None else _SLURM
        self._source_name = "pod-resources" if jobs is None else "slurm"
        self._holder_labels: HolderLabels = holder_labels if jobs is None else job_labels
        # Peak memory and the smallest fitting MIG profile per allocation (the MIG profile book).
        self._rightsizer = RightSizer(ledger, mig_profiles or MigProfileBook())
        # A tenure starts when a poll first sees it (accounted at once): one poll late at most.
        self._history = HolderHistory(slack=poll_interval + (update_interval or 0.0))
        self._rlog = RateLimitedLog(_log, period=60.0, clock=clock)
        self._snapshot: PodResourcesSnapshot | None = None
        self._up = False
        self._transitions = 0
        self._allocations = Allocations()
        # (snapshot, cdi index, devices) self._allocations was resolved from
        self._resolved: tuple[object, ...] = ()
        self._device_ids: tuple[DeviceId, ...] = ()  # the devices at the last poll
        self._pod_names: dict[str, PodName] = {}
        self._pids: dict[int, _PidOwner] = {}
        self._holders = HolderSnapshot()
        # Every GPU process of the last scan, classed (allocation/unseen.py); the pods seen only
        # through their processes; the processes of no pod or a gone one, by PID, for activity.
        self._classified: list[ClassifiedProcess] = []
        self._observed: list[Holding] = []
        self._unattributed_pids: dict[int, str] = {}
        self._unattributed = UnattributedMemory()
        self._memory: list[Sample] = []
        self._samples: list[Sample] = []
        self._dirty = True  # the samples are rebuilt when next read
        # A scan or activity read that timed out, by job name: the next run waits for it to return.
        self._hung: dict[str, concurrent.futures.Future[Any]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._polled = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        poll, update, processes = self._intervals
        self._stopping = False
        self._tasks = [asyncio.create_task(self._every(poll, self.poll))]
        if update is not None:  # None: the sampler's rounds call round_done
            self._tasks.append(asyncio.create_task(self._every(update, self._update_async)))
        if processes is not None:  # None: per-container memory is off (no host /proc needed)
            self._tasks.append(asyncio.create_task(self._every(processes, self.scan_processes)))
            self._tasks.append(asyncio.create_task(self._every(poll, self.sample_activity)))

    async def stop(self) -> None:
        # Python 3.11 can lose a cancellation that races a finishing await; the flag still ends
        # each loop within one interval.
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._client.close()

    # -- what others read (on the event loop) ------------------------------------------------

    @property
    def up(self) -> bool:
        return self._up

    def samples(self) -> Iterable[Sample]:
        if self._dirty:
            self._rebuild()
        return self._samples

    def round_done(self) -> None:
        """A fast sampling round settled (the sampler calls this, RoundListener): account it."""
        self.update()

    @property
    def processes(self) -> Sequence[ClassifiedProcess]:
        """Every GPU process of the last scan with its class (the status page lists them)."""
        return self._classified

    @property
    def allocations(self) -> Allocations:
        """The last resolved allocations: device-plugin and DRA holdings alike (a DRA holding
        names its claim), and the schedulable devices."""
        return self._allocations

    def holder(self, uuid: str, at_wall_time: float, pid: int | None = None) -> PodKey | None:
        """(namespace, pod) that held ``uuid`` then (see :meth:`HolderSnapshot.holder`)."""
        return self._holders.holder(uuid, at_wall_time, pid)

    def holders(self) -> HolderSnapshot:
        """Who held which device, as of the last update and process scan: an immutable value,
        so any thread may call this (the Xid readers attribute with it)."""
        return self._holders

    def _publish_holders(self, *, history_changed: bool = True) -> None:
        """Freeze the holder history and the PIDs' pods for :meth:`holders`, when either changed."""
        by_pid = {pid: owner.pod for pid, owner in self._pids.items()}
        if history_changed or by_pid != self._holders.by_pid:
            self._holders = self._history.snapshot(by_pid)

    async def wait_for_poll(self) -> None:
        """Wait for the next poll to finish (tests and callers that need fresh data)."""
        self._polled.clear()
        await self._polled.wait()

    # -- the three steps (public so tests can drive them without the loops) -----------------

    async def poll(self) -> None:
        """Ask the kubelet (or Slurm) once; mark the source up or down."""
        if self._jobs is not None:
            await self._poll_jobs(self._jobs)
            self._polled.set()
            return
        device_ids = tuple(d.id for d in self._devices())
        devices_changed, self._device_ids = device_ids != self._device_ids, device_ids
        try:
            snapshot = await self._client.fetch(refresh_allocatable=devices_changed)
        except PodResourcesError as exc:
            self._set_down(str(exc))
        else:
            if any(c.driver == GPU_DRIVER for c in snapshot.claims):
                self._cdi = await asyncio.to_thread(self._cdi_reader.read)
            came_up, changed = not self._up, snapshot is not self._snapshot
            self._snapshot, self._up = snapshot, True
            if came_up:
                self._transitions += 1
                self._rlog.info(
                    "came-up", "pod-resources source is up", containers=len(snapshot.containers)
                )
            if came_up or changed:
                self.update()  # account and publish at once rather than at the next round
            await self.place()
        self._polled.set()

    async def _poll_jobs(self, jobs: JobSource) -> None:
        """Slurm's answer, read on the worker pool within the call timeout; a read still stuck
        from an earlier poll is not started again beside it."""
        if self._still_hung("jobs"):
            self._set_down("the previous read has not returned")
            return
        try:
            found = await self._executor.call(jobs.read, within=self._job_timeout)
        except CallTimedOut as exc:
            self._hung["jobs"] = exc.future
            self._set_down(f"no answer within {self._job_timeout:g}s")
            return
        except (PoolExhausted, SlurmError) as exc:
            self._set_down(str(exc))
            return
        came_up, changed = not self._up, found != self._job_answer
        self._job_answer, self._up = found, True
        if came_up:
            self._transitions += 1
            self._rlog.info("came-up", "slurm source is up", jobs=len(found.jobs))
        if came_up or changed:
            self.update()

    def update(self) -> None:
        """Resolve the last poll against the devices, account time, rebuild the samples."""
        allocations = self._current() if self._up else None
        if allocations is None:
            self._accountant.pause()
            self._dirty = True
            return
        self._note_unresolved(allocations)
        held = _held(allocations)
        for holding in self._observed:  # a pod's processes on a device it holds no allocation of
            pods = held.setdefault(holding.device, set())
            if holding.pod_key not in pods:
                pods.add(holding.pod_key)
        self._accountant.update(self._clock(), held, allocations.replicated)
        self._rightsizer.update(self._clock(), held)
        if self._history.observe(self._wall_clock(), held):
            self._publish_holders()
        self._allocations = allocations
        self._dirty = True

    def _current(self) -> Allocations | None:
        if self._jobs is None:
            return None if self._snapshot is None else self._resolve(self._snapshot)
        return None if self._job_answer is None else self._resolve_jobs(self._job_answer)

    def _resolve_jobs(self, found: JobGpus) -> Allocations:
        """Slurm's jobs as holdings of whole GPUs (Slurm's MIG GRES is not read)."""
        devices = tuple(d.id for d in self._devices())
        key = (found, devices)
        last = self._resolved
        if last and last[0] is found and last[1] == devices:
            return self._allocations
        self._resolved = key
        resolved = resolve(found, devices)
        self._job_holdings = resolved.holdings
        holdings = [
            Holding(h.device, "", h.job.job_id, "", SLURM_RESOURCE) for h in resolved.holdings
        ]
        whole = [d for d in devices if not d.is_mig]
        return Allocations(holdings=holdings, schedulable=whole)

    def _resolve(self, snapshot: PodResourcesSnapshot) -> Allocations:
        """The snapshot against the devices; the last result while neither changed (the usual
        case: resolving is per-poll work that does not change between polls)."""
        devices = tuple(d.id for d in self._devices())
        key = (snapshot, self._cdi, devices)
        last = self._resolved
        if last and last[0] is snapshot and last[1] is self._cdi and last[2] == devices:
            return self._allocations
        self._resolved = key
        return resolve_snapshot(snapshot, list(devices), self._cdi, exclude=self._self_pod)

    @property
    def placement(self) -> PlacementSnapshot:
        """Where the holders' GPUs and CPUs sit, as of the last allocation change."""
        return self._placement

    async def place(self) -> None:
        """Read the topology and place the holders when the allocations, the devices or the
        CPU assignments changed since the last placement (worker thread, bounded)."""
        if self._snapshot is None or not self._up:
            return
        if self._still_hung("placement"):
            return
        devices = list(self._devices())
        allocations, cpus = self._allocations, self._snapshot.cpus
        # What a placement depends on: not the devices' other identity (their activity source
        # changes when DCGM connects, say), which would read the topology again for nothing.
        held = frozenset((h.device.uuid, *h.pod_key, h.container) for h in allocations.holdings)
        key = (held, cpus, tuple((d.uuid, d.id.mig_mode) for d in devices))
        if key == self._placed_from:
            return
        job = partial(self._placement_reader, devices, allocations, cpus)
        try:
            result = await self._run("placement", job)
        except Exception as exc:  # a GPU lost mid-read included: tried again at the next poll
            self._warn("placement-failed", "topology read failed", error=repr(exc))
            return
        if result is not None:
            self._placement, self._placed_from = result, key
            self._dirty = True

    async def scan_processes(self) -> None:
        """Map GPU processes to containers (on a worker thread); skipped while one is stuck."""
        if self._still_hung("scan"):
            return  # an NVML call hung in the previous scan; do not pile up threads
        devices = [d for d in self._devices() if d.id.is_mig or d.id.mig_mode != "enabled"]
        job = partial(
            scan,
            devices,
            self._lister,
            self._proc_path,
            self._pod_logs_path,
            set(self._pod_names),
            self._compute_mode,
            self._held_pod_uids(),
        )
        if self._jobs is not None:  # processes belong to jobs, not pods
            found = await self._run("scan", partial(_scan_jobs, job, self._proc_path))
            if found is not None:
                self._apply_scan(*found)
            return
        result = await self._run("scan", job)
        if result is not None:
            self._apply_scan(result)

    async def sample_activity(self) -> None:
        """Read new per-process utilisation samples (worker thread) and sum them per container."""
        if self._still_hung("activity"):
            return
        devices = [d for d in self._devices() if not d.id.is_mig and d.id.mig_mode != "enabled"]
        result = await self._run("activity", partial(_read_samples, devices, self._reader))
        if result is None:
            return
        now, wall_now = self._clock(), self._wall_clock()
        for device, samples in result:
            self._activity.add(device, samples, self._owner_of, now=now, wall_now=wall_now)
        self._dirty = True

    def _owner_of(self, pid: int) -> Owner | None:
        owner = self._pids.get(pid)
        if owner is not None:
            return (*owner.pod, owner.container)
        process_class = self._unattributed_pids.get(pid)
        return None if process_class is None else unattributed_owner(process_class)

    def _held_pod_uids(self) -> frozenset[tuple[str, str]]:
        """(device uuid, pod UID) of every holding whose pod UID is known: the scan reads the
        command name of every other process (for the status page) and of none of these."""
        uids = {(n.namespace, n.pod): uid for uid, n in self._pod_names.items()}
        holdings = self._allocations.holdings
        return frozenset((h.device.uuid, uids[h.pod_key]) for h in holdings if h.pod_key in uids)

    async def _run(self, name: str, job: Callable[[], T]) -> T | None:
        """``job`` on the worker pool, given up after the scan timeout (a hung NVML call)."""
        try:
            return await self._executor.call(job, within=self._scan_timeout)
        except CallTimedOut as exc:
            self._hung[name] = exc.future
            self._warn(f"{name}-timeout", f"{name} timed out", timeout_s=self._scan_timeout)
        except PoolExhausted as exc:
            self._warn(f"{name}-submit", f"{name} not started", error=str(exc))
        return None

    def _still_hung(self, name: str) -> bool:
        future = self._hung.get(name)
        return future is not None and not future.done()

    # -- internals ---------------------------------------------------------------------------

    async def _update_async(self) -> None:
        self.update()

    async def _every(self, interval: float, step: Callable[[], Coroutine[Any, Any, None]]) -> None:
        async for _ in ticks(interval):
            if self._stopping:
                return
            try:
                await step()
            except Exception:  # a bug in one step must not stop the loop for good
                _log.exception("allocation step failed", step=getattr(step, "__name__", "?"))

    def _set_down(self, reason: str) -> None:
        """Rate-limited like the way up: a flapping kubelet writes a line each way a period."""
        error = cut_reason(reason)
        if self._up:
            self._transitions += 1
            self._warn(
                "went-down", f"{self._source_name} source is down; series withheld", error=error
            )
        else:
            self._warn("down", f"{self._source_name} source unavailable", error=error)
        self._up = False
        self._snapshot = None
        self._job_answer = None
        self._accountant.pause()
        self._dirty = True  # withhold the allocation series from the next rendering on

    def _apply_scan(self, result: ScanResult, jobs: Mapping[int, str] | None = None) -> None:
        """``jobs``: on a Slurm node, PID -> job id (:mod:`.jobprocs`); a process outside any
        job is skipped like a host process."""
        if result.pods:
            self._pod_names = result.pods
        if result.failed:
            self._warn("scan-failed", "process listing failed", uuids=result.failed)
        now = self._wall_clock()
        self._mps = {p.device.uuid for p in result.processes if p.mps}
        self._compute_modes = result.compute_modes
        memory: dict[tuple[DeviceId, str, str, str], list[int | None]] = {}
        holders = _ContainerIndex(self._allocations)
        held = None  # unknown until the kubelet answers
        if self._snapshot is not None:
            held = frozenset((h.device.uuid, h.pod_key) for h in self._allocations.holdings)
        listed = self._listed_pods()
        classified: list[ClassifiedProcess] = []
        self._unattributed_pids = {}
        for process in result.processes:
            if jobs is not None:
                job_id = jobs.get(process.pid)
                if job_id is not None:
                    self._pids[process.pid] = _PidOwner(("", job_id), now)
                    memory.setdefault((process.device, "", job_id, ""), []).append(
                        process.used_bytes
                    )
                continue
            process_class, pod = classify(process, self._pod_names, listed, held)
            names = self._pod_names.get(process.owner.pod_uid) if process.owner else None
            if pod is None or names is None or process_class in UNATTRIBUTED:
                self._unattributed_pids[process.pid] = process_class
                classified.append(ClassifiedProcess(process, process_class, pod))
                continue
            container = holders.container(process.device, pod, names)
            classified.append(ClassifiedProcess(process, process_class, pod, container))
            self._pids[process.pid] = _PidOwner(pod, now, container)
            key = (process.device, *pod, container)
            memory.setdefault(key, []).append(process.used_bytes)
        self._pids = {p: o for p, o in self._pids.items() if now - o.seen < PID_RETENTION}
        self._classified = classified
        self._observed = observed_holdings(classified)
        self._unattributed.update(classified)
        self._publish_holders(history_changed=False)
        self._memory = list(memory_samples(memory, self._holder_labels))
        self._rightsizer.observe_memory(memory)
        self._dirty = True

    def _listed_pods(self) -> frozenset[PodKey]:
        """The pods the kubelet lists; while it does not answer, every pod a log directory
        names (none is called gone on a kubelet outage)."""
        if self._snapshot is not None:
            return self._snapshot.pods
        return frozenset((n.namespace, n.pod) for n in self._pod_names.values())

    def _note_unresolved(self, allocations: Allocations) -> None:
        """Count each device id or DRA device once when it starts to resolve to nothing."""
        if allocations.unresolved:
            self._warn(
                "unresolved", "device ids match no device", ids=sorted(allocations.unresolved)
            )
        keys = {(UNKNOWN_DEVICE_ID, raw) for raw in allocations.unresolved}
        for miss in allocations.unresolved_claims:
            c = miss.claim
            claim, device = f"{c.claim_namespace}/{c.claim_name}", f"{c.driver}/{c.pool}/{c.device}"
            keys.add((miss.reason, f"{claim} {device}"))
            self._warn(
                f"dra-unresolved {claim} {device}",
                "DRA device resolves to no GPU",
                claim=claim,
                device=device,
                pod=f"{c.namespace}/{c.pod}",
                reason=miss.reason,
                cdi_devices=list(c.cdi_devices),
            )
        self._unresolved.observe(keys)
        if allocations.compute_domain_devices != self._allocations.compute_domain_devices:
            _log.debug(
                "compute-domain.nvidia.com devices skipped (IMEX channels, not GPUs)",
                count=allocations.compute_domain_devices,
            )

    def _rebuild(self) -> None:
        self._dirty = False
        samples = [
            Sample(SOURCE_UP, self._source_labels, 1.0 if self._up else 0.0),
            Sample(SOURCE_TRANSITIONS, self._source_labels, float(self._transitions)),
        ]
        if self._jobs is None:
            folded = self._snapshot.folded if self._snapshot is not None else Folded()
            samples.append(Sample(FOLDED, _FOLDED_IDS, float(folded.device_ids)))
            samples.append(Sample(FOLDED, _FOLDED_HOLDERS, float(folded.holders)))
            samples.extend(self._unresolved.samples())
        if self._up:
            allocations = self._allocations
            if self._jobs is None:
                observed = self._observed_now(allocations)
                samples.extend(
                    allocation_samples(allocations, self._accountant, self._rightsizer, observed)
                )
            else:
                samples.extend(
                    allocation_samples(
                        allocations,
                        self._accountant,
                        self._rightsizer,
                        holder=job_labels,
                        info=False,
                    )
                )
                samples.extend(job_info_samples(self._job_holdings))
            gpus = [d.id for d in self._devices() if not d.id.is_mig]
            samples.extend(sharing_samples(gpus, allocations, self._mps, self._compute_modes))
            samples.extend(placement_samples(self._placement, allocations))
        samples.extend(self._memory)
        samples.extend(activity_samples(self._activity, self._holder_labels))
        sampled = [d.id for d in self._devices() if not d.id.is_mig and d.id.mig_mode != "enabled"]
        samples.extend(unattributed_samples(sampled, self._unattributed, self._activity))
        self._samples = samples

    def _observed_now(self, allocations: Allocations) -> list[Holding]:
        """The last scan's process-only holders that still hold no allocation of their device."""
        held = {(h.device.uuid, h.pod_key) for h in allocations.holdings}
        return [h for h in self._observed if (h.device.uuid, h.pod_key) not in held]

    def _warn(self, key: str, event: str, **fields: Any) -> None:
        self._rlog.warning(key, event, **fields)


def cut_reason(reason: str) -> str:
    """A failure's text for the log: escaped (no control characters or non-ASCII from the
    kubelet's grpc-message reach it raw) and cut to REASON_CHARS."""
    escaped = reason.encode("ascii", "backslashreplace").decode("ascii")
    escaped = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in escaped)
    if len(escaped) <= REASON_CHARS:
        return escaped
    return f"{escaped[:REASON_CHARS]}... ({len(escaped) - REASON_CHARS} more)"


def _scan_jobs(
    scan_job: Callable[[], ScanResult], proc_path: Path
) -> tuple[ScanResult, dict[int, str]]:
    """A process scan, and the job each of its processes runs in (worker thread)."""
    result = scan_job()
    return result, read_process_jobs(proc_path, {p.pid for p in result.processes})


def _read_samples(
    devices: Iterable[Device], reader: Callable[[Device], list[ProcessSample] | None]
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
    """Which containers hold what, indexed once per process scan: a scan looks up every GPU
    process (hundreds on a MIG node), and searching the holdings for each was quadratic (7 ms
    on the event loop for 500 processes on 56 instances)."""

    def __init__(self, allocations: Allocations) -> None:
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


def _held(allocations: Allocations) -> dict[DeviceId, set[PodKey]]:
    held: dict[DeviceId, set[PodKey]] = {}
    for holding in allocations.holdings:
        held.setdefault(holding.device, set()).add(holding.pod_key)
    return held
