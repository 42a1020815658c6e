"""Where the holders come from: the kubelet's pod-resources API, or Slurm (docs/slurm.md).

A source is polled on the event loop. :meth:`~HolderSource.poll` asks once and says whether the
answer changed, or raises :class:`SourceDown` with the reason; the subsystem keeps whether the
source is up. :meth:`~HolderSource.resolve` turns the last answer into :class:`Allocations`
against the devices (the same value while neither changed: resolving is per-round work whose
result only changes with a poll).

- :class:`PodResourcesSource`: ``List`` (and ``GetAllocatableResources`` when due) through
  :class:`~.podresources.PodResourcesClient`, each call with a deadline; while containers hold
  DRA devices of ``gpu.nvidia.com``, the CDI spec directories and ``mig-minors`` too (on a
  worker thread, :mod:`.cdi`, :mod:`.dra`). Holders are (namespace, pod).
- :class:`SlurmSource`: a :class:`~.jobgpus.JobSource` (:mod:`.slurm`, :mod:`.jobmap`) read on
  the worker pool within the call timeout; a holder is ("", job id), whole GPUs only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

from ..devices import DeviceId
from ..exposition import Sample, label_string
from ..logs import RateLimitedLog, get_logger
from ..nvml import CallTimedOut, PoolExhausted, WorkerPool
from .cdi import CdiIndex, CdiReader
from .dra import GPU_DRIVER
from .jobgpus import JobGpus, JobHolding, JobSource, SlurmError, resolve
from .metrics import FOLDED, holder_labels, job_labels
from .model import Allocations, Holding, PodKey, resolve_snapshot
from .podresources import (
    ContainerCpus,
    Folded,
    PodResourcesClient,
    PodResourcesError,
    PodResourcesSnapshot,
)
from .pool_jobs import PoolJob
from .samples import UNKNOWN_DEVICE_ID, HolderLabels, UnresolvedCounts, job_info_samples

_log = get_logger("allocation")
SLURM_RESOURCE = "slurm"  # a job holding's resource (no gpu_allocation_info is published for it)
_FOLDED_IDS = label_string({"what": "device_ids"})
_FOLDED_HOLDERS = label_string({"what": "holders"})
# A kubelet's grpc-message is quoted this far in the log (escaped): it is the kubelet's text.
REASON_CHARS = 200


class SourceDown(Exception):
    """The source gave no answer; the message says why (the kubelet's own text, say)."""


class HolderSource(Protocol):
    name: str  # in the log: "pod-resources source is up"
    labels: str  # the source label of gpu_exporter_source_up and its transitions
    holder_labels: HolderLabels  # a holder's labels on its time counters
    info: bool  # whether its holders are told by gpu_allocation_info

    async def poll(self, devices: tuple[DeviceId, ...]) -> bool:
        """Ask once; whether the answer changed. Raises :class:`SourceDown`."""
        ...

    @property
    def listed_pods(self) -> frozenset[PodKey] | None:
        """The pods the kubelet lists; None while it does not answer (or on a Slurm node)."""
        ...

    @property
    def cpus(self) -> tuple[ContainerCpus, ...] | None:
        """The containers' CPU ids and memory nodes, to place holders by; None: no placement."""
        ...

    def forget(self) -> None:
        """The source went down: its last answer no longer says who holds what."""
        ...

    async def close(self) -> None: ...

    def resolve(self, devices: tuple[DeviceId, ...]) -> Allocations | None:
        """The last answer against ``devices``; None while there is none."""
        ...

    def came_up_fields(self) -> dict[str, int]:
        """What the "came up" log line says about the first answer."""
        ...

    def self_samples(self) -> Iterable[Sample]:
        """The source's own self-metrics, published whether it is up or not."""
        ...

    def holder_samples(self) -> Iterable[Sample]:
        """Series that tell the holders, published while the source is up."""
        ...


class PodResourcesSource:
    name = "pod-resources"
    labels = label_string({"source": "pod_resources"})
    info = True

    def __init__(
        self,
        client: PodResourcesClient,
        cdi_reader: CdiReader,
        log: RateLimitedLog,
        *,
        self_pod: PodKey | None = None,
    ) -> None:
        self.holder_labels: HolderLabels = holder_labels
        self.answer: PodResourcesSnapshot | None = None
        self._client = client
        self._cdi_reader = cdi_reader
        self._cdi = CdiIndex()
        self._log = log
        self._self_pod = self_pod
        self._device_ids: tuple[DeviceId, ...] = ()  # the devices at the last poll
        self._unresolved = UnresolvedCounts()
        # What the last resolution was made from (answer, CDI index, devices), and its result
        self._resolved_from: tuple[object, ...] = ()
        self._resolved = Allocations()

    async def poll(self, devices: tuple[DeviceId, ...]) -> bool:
        devices_changed, self._device_ids = devices != self._device_ids, devices
        try:
            snapshot = await self._client.fetch(refresh_allocatable=devices_changed)
        except PodResourcesError as exc:
            raise SourceDown(str(exc)) from None
        if any(c.driver == GPU_DRIVER for c in snapshot.claims):
            self._cdi = await asyncio.to_thread(self._cdi_reader.read)
        changed, self.answer = snapshot is not self.answer, snapshot
        return changed

    def forget(self) -> None:
        self.answer = None

    async def close(self) -> None:
        await self._client.close()

    def came_up_fields(self) -> dict[str, int]:
        return {"containers": len(self.answer.containers) if self.answer is not None else 0}

    @property
    def listed_pods(self) -> frozenset[PodKey] | None:
        return None if self.answer is None else self.answer.pods

    @property
    def cpus(self) -> tuple[ContainerCpus, ...] | None:
        return None if self.answer is None else self.answer.cpus

    def resolve(self, devices: tuple[DeviceId, ...]) -> Allocations | None:
        snapshot = self.answer
        if snapshot is None:
            return None
        last = self._resolved_from
        if not (last and last[0] is snapshot and last[1] is self._cdi and last[2] == devices):
            self._resolved_from = (snapshot, self._cdi, devices)
            resolved = resolve_snapshot(snapshot, list(devices), self._cdi, exclude=self._self_pod)
        else:
            resolved = self._resolved
        self._note_unresolved(resolved, self._resolved)
        self._resolved = resolved
        return resolved

    def self_samples(self) -> Iterable[Sample]:
        folded = self.answer.folded if self.answer is not None else Folded()
        yield Sample(FOLDED, _FOLDED_IDS, float(folded.device_ids))
        yield Sample(FOLDED, _FOLDED_HOLDERS, float(folded.holders))
        yield from self._unresolved.samples()

    def holder_samples(self) -> Iterable[Sample]:
        return ()

    def _note_unresolved(self, allocations: Allocations, before: Allocations) -> None:
        """Count each device id or DRA device once when it starts to resolve to nothing (each
        resolution warns, rate-limited, while it still does)."""
        if allocations.unresolved:
            self._log.warning(
                "unresolved", "device ids match no device", ids=sorted(allocations.unresolved)
            )
        keys = {(UNKNOWN_DEVICE_ID, raw) for raw in allocations.unresolved}
        for miss in allocations.unresolved_claims:
            c = miss.claim
            claim, device = f"{c.claim_namespace}/{c.claim_name}", f"{c.driver}/{c.pool}/{c.device}"
            keys.add((miss.reason, f"{claim} {device}"))
            self._log.warning(
                f"dra-unresolved {claim} {device}",
                "DRA device resolves to no GPU",
                claim=claim,
                device=device,
                pod=f"{c.namespace}/{c.pod}",
                reason=miss.reason,
                cdi_devices=list(c.cdi_devices),
            )
        self._unresolved.observe(keys)
        if allocations.compute_domain_devices != before.compute_domain_devices:
            _log.debug(
                "compute-domain.nvidia.com devices skipped (IMEX channels, not GPUs)",
                count=allocations.compute_domain_devices,
            )


class SlurmSource:
    name = "slurm"
    labels = label_string({"source": "slurm"})
    info = False  # gpu_slurm_job_info tells the holders instead

    def __init__(
        self, jobs: JobSource, pool: WorkerPool, timeout: float, log: RateLimitedLog
    ) -> None:
        self.holder_labels: HolderLabels = job_labels
        self.answer: JobGpus | None = None
        self._jobs = jobs
        self._pool = pool
        self._read = PoolJob("jobs", timeout, log)
        self._resolved_from: tuple[object, ...] = ()
        self._resolved = Allocations()
        self._holdings: tuple[JobHolding, ...] = ()

    async def poll(self, devices: tuple[DeviceId, ...]) -> bool:
        """A read still stuck from an earlier poll is not started again beside it."""
        if self._read.stuck:
            raise SourceDown("the previous read has not returned")
        try:
            found = await self._read.call(self._pool, self._jobs.read)
        except CallTimedOut:
            raise SourceDown(f"no answer within {self._read.timeout:g}s") from None
        except (PoolExhausted, SlurmError) as exc:
            raise SourceDown(str(exc)) from None
        changed, self.answer = found != self.answer, found
        return changed

    listed_pods = None  # processes belong to jobs, not pods
    cpus = None  # Slurm's CPU binding is not read: no placement

    def forget(self) -> None:
        self.answer = None

    async def close(self) -> None:
        pass

    def came_up_fields(self) -> dict[str, int]:
        return {"jobs": len(self.answer.jobs) if self.answer is not None else 0}

    def resolve(self, devices: tuple[DeviceId, ...]) -> Allocations | None:
        """Slurm's jobs as holdings of GPUs, MIG instances and shared GPUs (gres/shard)."""
        found = self.answer
        if found is None:
            return None
        last = self._resolved_from
        if last and last[0] is found and last[1] == devices:
            return self._resolved
        self._resolved_from = (found, devices)
        resolved = resolve(found, devices)
        self._holdings = resolved.holdings
        holdings = [
            Holding(h.device, "", h.job.job_id, "", SLURM_RESOURCE) for h in resolved.holdings
        ]
        self._resolved = Allocations(
            holdings=holdings,
            schedulable=list(resolved.schedulable),
            replicated=set(resolved.shared),
        )
        return self._resolved

    def self_samples(self) -> Iterable[Sample]:
        return ()

    def holder_samples(self) -> Iterable[Sample]:
        return job_info_samples(self._holdings)


def cut_reason(reason: str) -> str:
    """A failure's text for the log: escaped (no control characters or non-ASCII from the
    kubelet's grpc-message reach it raw) and cut to REASON_CHARS."""
    escaped = reason.encode("ascii", "backslashreplace").decode("ascii")
    escaped = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in escaped)
    if len(escaped) <= REASON_CHARS:
        return escaped
    return f"{escaped[:REASON_CHARS]}... ({len(escaped) - REASON_CHARS} more)"
