"""Allocation against activity: who holds each device, what it does, and the idle time it wastes.

Three background loops and the sampler's rounds feed one immutable :class:`AllocationSnapshot`
(:mod:`.published`), which the subsystem replaces after each change and everyone else reads:

- *poll* (every ``poll_interval``): the holder source (:mod:`.holder_sources`: the kubelet's
  pod-resources API, or Slurm). While it is absent or failing,
  ``gpu_exporter_source_up{source="pod_resources"}`` is 0 and every allocation series is
  withheld (unknown is not zero); the next successful poll brings them back. A poll that sees
  the holders change accounts and publishes at once. One that changes the holdings (or the
  devices, or the kubelet's CPU assignments), and the first one, also reads the node's
  topology (NVML, on a worker thread, bounded like the scan) and places each holder
  (:mod:`.placement`): the paths and NUMA series show that placement until the next change.
- *account* (after each fast sampling round: the sampler calls :meth:`round_done`, a
  ``RoundListener``): allocated and idle-allocated seconds per device and pod
  (:mod:`.accounting`), right-sizing (:mod:`.rightsizing`) and the holder history used to
  attribute events (:mod:`.history`). Driven by the rounds, each accounting step sees exactly
  one new ledger interval per device, and what it publishes is in that round's exposition.
- *processes* (every ``process_interval``): GPU processes (NVML, on a worker thread) to their
  pods and containers (:mod:`.process_owners`), for ``gpu_container_memory_used_bytes``,
  PID-based attribution, MPS clients, compute modes and the processes of no pod.
- *activity* (every ``poll_interval``, with *processes*): per-process utilisation samples (NVML,
  on a worker thread) summed per container (:mod:`.process_activity`), for
  ``gpu_container_sm_active_*`` and the per-pod idle rule on shared devices.

Nothing here runs on the scrape path: :meth:`samples` returns the published snapshot's series.
Each step rebuilds only the part of them it changed (the time counters after each round).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..devices import Device, DeviceId
from ..exposition import Family, Sample
from ..families import SOURCE_UP
from ..ledger import ActivityLedger
from ..logs import RateLimitedLog, get_logger
from ..migprofiles import MigProfileBook
from ..nvml import ErrorCounter, WorkerPool
from ..ticks import ticks
from .accounting import IdleAccountant
from .cdi import CdiReader
from .history import HolderHistory, HolderSnapshot
from .holder_sources import HolderSource, PodResourcesSource, SlurmSource, SourceDown, cut_reason
from .jobgpus import JobSource
from .metrics import FAMILIES, SOURCE_TRANSITIONS
from .model import Allocations, PodKey
from .placement import PlacementRead, PlacementReader, PlacementSnapshot, Placer
from .podresources import PodResourcesClient
from .pool_jobs import PoolJob
from .process_activity import ProcessSample, ProcessUtilizationReader
from .process_owners import ProcessOwners
from .processes import ComputeModeReader, NvmlProcessLister, ProcessLister
from .published import AllocationSnapshot
from .rightsizing import FAMILIES as RIGHTSIZING_FAMILIES
from .rightsizing import RightSizer
from .samples import (
    AccountingSeries,
    activity_samples,
    holding_samples,
    memory_samples,
    placement_samples,
    renewed,
    sharing_samples,
    unattributed_samples,
)
from .unseen import ClassifiedProcess

_log = get_logger("allocation")


@dataclass(frozen=True)
class AllocationSettings:
    """What the allocation subsystem is configured with, built from ``Config`` in
    ``app._build_allocation`` only. The defaults are what a node run without flags gets (but
    ``sysfs_path``), for tests; tests/allocation/test_settings.py keeps them so.

    ``poll_interval``: how often the holder source is asked. ``process_interval`` None: no
    process scan or activity read (per-container memory off: no host ``/proc`` needed).
    ``call_timeout``: each kubelet call's deadline, and the Slurm read's (a process scan or
    topology read gets at least 5 s). ``allocatable_interval``: how often
    ``GetAllocatableResources`` is asked when nothing changed. ``self_pod``: the exporter's own
    pod, whose allocations are not counted. ``sysfs_path`` None: placement asks NVML only.
    ``phase``: where in each interval of loop time the poll, process scan and activity read
    tick; half the sampler's fast interval, whose rounds tick at 0, so that their work (the
    process scan's and activity read's on the worker threads, the poll's on the loop) falls
    between rounds instead of adding to one while the loop waits for the GIL."""

    socket_path: Path
    proc_path: Path = Path("/proc")
    pod_logs_path: Path = Path("/var/log/pods")
    cdi_spec_dirs: tuple[Path, ...] = (Path("/var/run/cdi"), Path("/etc/cdi"))
    mig_minors_path: Path = Path("/proc/driver/nvidia-caps/mig-minors")
    sysfs_path: Path | None = None
    self_pod: PodKey | None = None
    idle_threshold: float = 0.05
    poll_interval: float = 1.0
    process_interval: float | None = 5.0
    call_timeout: float = 2.0
    allocatable_interval: float = 30.0
    phase: float = 0.5


class AllocationSubsystem:
    """Built from :class:`AllocationSettings`; nothing runs until :meth:`start`.

    ``devices`` (the sampler's), ``ledger`` and ``mig_profiles`` (the collectors write them),
    ``errors`` (NVML error counts) and ``executor`` are shared with the rest of the exporter.
    ``jobs``: a Slurm source (:mod:`.slurm`, :mod:`.jobmap`) instead of the kubelet; a holder
    is then ("", job id), and its series are labelled ``job_id`` (docs/slurm.md).

    Stand-ins (tests): ``clock`` and ``wall_clock``, ``process_lister`` (NVML's process
    lists), ``utilization_reader`` (per-process utilisation), ``placement_reader`` (the
    topology read)."""

    families: Sequence[Family] = (*FAMILIES, *RIGHTSIZING_FAMILIES, SOURCE_UP)

    def __init__(
        self,
        settings: AllocationSettings,
        *,
        devices: Callable[[], Iterable[Device]],
        ledger: ActivityLedger,
        executor: WorkerPool,
        mig_profiles: MigProfileBook | None = None,
        errors: ErrorCounter | None = None,
        jobs: JobSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        process_lister: ProcessLister | None = None,
        utilization_reader: Callable[[Device], list[ProcessSample] | None] | None = None,
        placement_reader: PlacementRead | None = None,
    ) -> None:
        self.settings = settings
        self._devices = devices
        self._executor = executor
        self._clock = clock
        self._wall_clock = wall_clock
        self._rlog = RateLimitedLog(_log, period=60.0, clock=clock)
        self._source: HolderSource
        if jobs is None:
            client = PodResourcesClient(
                settings.socket_path,
                timeout=settings.call_timeout,
                allocatable_interval=settings.allocatable_interval,
                clock=clock,
            )
            cdi = CdiReader(settings.cdi_spec_dirs, settings.mig_minors_path)
            self._source = PodResourcesSource(client, cdi, self._rlog, self_pod=settings.self_pod)
        else:
            self._source = SlurmSource(jobs, executor, settings.call_timeout, self._rlog)
        self._up = False
        self._transitions = 0
        # Worker-pool work, each bounded; a hung one (an NVML call) holds back its next run.
        timeout = max(settings.call_timeout, 5.0)
        self._owners = ProcessOwners(
            executor,
            proc_path=settings.proc_path,
            pod_logs_path=settings.pod_logs_path,
            scan=PoolJob("scan", timeout, self._rlog),
            activity=PoolJob("activity", timeout, self._rlog),
            lister=process_lister or NvmlProcessLister(errors),
            compute_mode=ComputeModeReader(errors),
            utilization=utilization_reader or ProcessUtilizationReader(errors),
            clock=clock,
            wall_clock=wall_clock,
            job_node=jobs is not None,
        )
        self._placer = Placer(
            placement_reader or PlacementReader(settings.sysfs_path, errors),
            PoolJob("placement", timeout, self._rlog),
            self._rlog,
        )
        # A finished job's counters leave within one poll (issue 38); a pod's stay for a scrape.
        retention = {} if jobs is None else {"retention": settings.poll_interval}
        self._accountant = IdleAccountant(
            ledger, settings.idle_threshold, pods=self._owners.activity, **retention
        )
        # Peak memory and the smallest fitting MIG profile per allocation (the MIG profile book).
        self._rightsizer = RightSizer(ledger, mig_profiles or MigProfileBook())
        # A tenure starts when a poll first sees it (accounted at once): one poll late at most.
        self._history = HolderHistory(slack=settings.poll_interval)
        self._device_ids: tuple[DeviceId, ...] = ()  # the devices at the last accounting round
        self._holdings_for: Allocations | None = None  # what self._holdings shows, if current
        # The published series in parts, each rebuilt by the steps that change it.
        self._holdings: tuple[Sample, ...] = ()  # who holds what, schedulable devices
        self._accounting = AccountingSeries()  # time counters and right-sizing
        self._shown: tuple[Sample, ...] = ()  # job info, sharing modes, placement
        self._memory: tuple[Sample, ...] = ()  # per-container memory (each process scan)
        self._activity: tuple[Sample, ...] = ()  # per-container activity (each activity read)
        self.published = AllocationSnapshot()
        self._publish()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._polled = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        poll, processes = self.settings.poll_interval, self.settings.process_interval
        self._stopping = False
        self._tasks = [asyncio.create_task(self._every(poll, self.poll))]
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
        await self._source.close()

    # -- what others read --------------------------------------------------------------------

    def samples(self) -> Iterable[Sample]:
        """The published series (SampleSource): those of the snapshot published now, read on
        any thread (the sampler adds this source frozen, so its render thread reads them)."""
        return self.published.samples()

    def holders(self) -> HolderSnapshot:
        """Who held which device, as published: an immutable value, so any thread may call
        this (the Xid readers attribute with it)."""
        return self.published.holders

    @property
    def processes(self) -> Sequence[ClassifiedProcess]:
        """Every GPU process of the last scan with its class (the status page lists them)."""
        return self.published.processes

    async def wait_for_poll(self) -> None:
        """Wait for the next poll to finish (tests and callers that need fresh data)."""
        self._polled.clear()
        await self._polled.wait()

    # -- the steps (public so tests can drive them without the loops) ------------------------

    def round_done(self) -> None:
        """A fast sampling round settled (the sampler calls this, RoundListener): resolve the
        last poll against the devices, account the time since the last round, publish."""
        device_ids = tuple(d.id for d in self._devices())
        devices_changed, self._device_ids = device_ids != self._device_ids, device_ids
        allocations = self._source.resolve(device_ids) if self._up else None
        if allocations is None:
            self._accountant.pause()
            if devices_changed:
                self._rebuild_processes()
            self._publish()
            return
        held = _held(allocations)
        for holding in self._owners.observed:  # a pod's processes on a device it holds nothing of
            pods = held.setdefault(holding.device, set())
            if holding.pod_key not in pods:
                pods.add(holding.pod_key)
        self._accountant.update(self._clock(), held, allocations.replicated)
        self._rightsizer.update(self._clock(), held)
        holders = self.published.holders
        if self._history.observe(self._wall_clock(), held):
            holders = self._history.snapshot(self._owners.by_pid)
        self._rebuild_accounting()
        if devices_changed or allocations is not self._holdings_for:
            self._rebuild_holdings(allocations)
        if devices_changed:
            self._rebuild_processes()
        self._publish(allocations=allocations, holders=holders)

    async def poll(self) -> None:
        """Ask the holder source once; mark it up or down."""
        try:
            changed = await self._source.poll(tuple(d.id for d in self._devices()))
        except SourceDown as exc:
            self._set_down(str(exc))
        else:
            came_up = not self._up
            self._up = True
            if came_up:
                self._transitions += 1
                name = self._source.name
                self._rlog.info("came-up", f"{name} source is up", **self._source.came_up_fields())
            if came_up or changed:
                self.round_done()  # account and publish at once rather than at the next round
            await self.place()
        self._polled.set()

    async def place(self) -> None:
        """Place the holders again when the allocations, the devices or the CPU assignments
        changed since the last placement (topology read on a worker thread, bounded)."""
        cpus = self._source.cpus
        if cpus is None or not self._up:
            return
        devices = list(self._devices())
        placement = await self._placer.place(
            self._executor, devices, self.published.allocations, cpus
        )
        if placement is not None:
            self._rebuild_holdings(self.published.allocations, placement)
            self._publish(placement=placement)

    async def scan_processes(self) -> None:
        """Map GPU processes to containers (on a worker thread); skipped while one is stuck."""
        scanned = await self._owners.scan(self._devices(), self.published.allocations)
        if scanned is None:
            return
        result, jobs = scanned
        if result.failed:
            self._warn("scan-failed", "process listing failed", uuids=result.failed)
        owners = self._owners
        changed = owners.apply(result, self.published.allocations, self._source.listed_pods, jobs)
        self._rightsizer.observe_memory(owners.memory)
        holders = self.published.holders
        if owners.by_pid != holders.by_pid:
            holders = self._history.snapshot(owners.by_pid)
        if changed:  # a scan that found what the last one did builds no series again
            self._rebuild_holdings(self.published.allocations)
            self._rebuild_processes()
        self._rebuild_accounting()  # the peaks right-sizing fits
        self._publish(holders=holders, processes=owners.classified)

    async def sample_activity(self) -> None:
        """Read new per-process utilisation samples (worker thread) and sum them per container."""
        first_own = await self._owners.read_activity(self._devices())
        if first_own is None:
            return
        if first_own:
            self._rebuild_accounting()  # a shared device's first own samples: its idle series
        self._rebuild_processes(memory=False)
        self._publish()

    # -- internals ---------------------------------------------------------------------------

    async def _every(self, interval: float, step: Callable[[], Coroutine[Any, Any, None]]) -> None:
        async for _ in ticks(interval, self.settings.phase):
            if self._stopping:
                return
            try:
                await step()
            except Exception:  # a bug in one step must not stop the loop for good
                _log.exception("allocation step failed", step=getattr(step, "__name__", "?"))

    def _set_down(self, reason: str) -> None:
        """Rate-limited like the way up: a flapping kubelet writes a line each way a period."""
        error, name = cut_reason(reason), self._source.name
        if self._up:
            self._transitions += 1
            self._warn("went-down", f"{name} source is down; series withheld", error=error)
        else:
            self._warn("down", f"{name} source unavailable", error=error)
        self._up = False
        self._source.forget()
        self._accountant.pause()
        self._holdings = self._shown = ()  # withheld from now on
        self._accounting = AccountingSeries()
        self._holdings_for = None
        self._publish()

    def _rebuild_holdings(
        self, allocations: Allocations, placement: PlacementSnapshot | None = None
    ) -> None:
        if not self._up:
            self._holdings = self._shown = ()
            return
        self._holdings_for = allocations
        source, owners = self._source, self._owners
        observed = owners.observed_now(allocations) if source.info else ()
        holdings = holding_samples(allocations, observed, info=source.info)
        self._holdings = renewed(self._holdings, holdings)
        gpus = [d.id for d in self._devices() if not d.id.is_mig]
        placed = self.published.placement if placement is None else placement
        shown = (
            *source.holder_samples(),
            *sharing_samples(gpus, allocations, owners.mps, owners.compute_modes),
            *placement_samples(placed, allocations),
        )
        self._shown = renewed(self._shown, shown)

    def _rebuild_accounting(self) -> None:
        if not self._up:
            self._accounting = AccountingSeries()
            return
        usages, rightsizing = self._accountant.readings(), self._rightsizer.reading()
        self._accounting = AccountingSeries(usages, rightsizing, self._source.holder_labels)

    def _rebuild_processes(self, *, memory: bool = True) -> None:
        """``memory`` False: only the activity read changed (the memory is the last scan's)."""
        labels, owners = self._source.holder_labels, self._owners
        sampled = [d.id for d in self._devices() if not d.id.is_mig and d.id.mig_mode != "enabled"]
        if memory:
            self._memory = renewed(self._memory, memory_samples(owners.memory, labels))
        activity = (
            *activity_samples(owners.activity, labels),
            *unattributed_samples(sampled, owners.unattributed, owners.activity),
        )
        self._activity = renewed(self._activity, activity)

    def _publish(
        self,
        *,
        allocations: Allocations | None = None,
        holders: HolderSnapshot | None = None,
        processes: tuple[ClassifiedProcess, ...] | None = None,
        placement: PlacementSnapshot | None = None,
    ) -> None:
        """Replace the published snapshot: the source's state, the series' parts as they are
        now, and the values given (the last published otherwise)."""
        last, source = self.published, self._source
        leading = (
            Sample(SOURCE_UP, source.labels, 1.0 if self._up else 0.0),
            Sample(SOURCE_TRANSITIONS, source.labels, float(self._transitions)),
            *source.self_samples(),
            *self._holdings,
        )
        self.published = AllocationSnapshot(
            up=self._up,
            allocations=last.allocations if allocations is None else allocations,
            holders=last.holders if holders is None else holders,
            processes=last.processes if processes is None else processes,
            placement=last.placement if placement is None else placement,
            leading=renewed(last.leading, leading),
            accounting=self._accounting,
            trailing=renewed(last.trailing, (*self._shown, *self._memory, *self._activity)),
        )

    def _warn(self, key: str, event: str, **fields: Any) -> None:
        self._rlog.warning(key, event, **fields)


def _held(allocations: Allocations) -> dict[DeviceId, set[PodKey]]:
    held: dict[DeviceId, set[PodKey]] = {}
    for holding in allocations.holdings:
        held.setdefault(holding.device, set()).add(holding.pod_key)
    return held
