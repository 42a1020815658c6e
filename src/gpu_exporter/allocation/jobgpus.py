"""Which GPUs each Slurm job on this node holds: the answer every Slurm source gives
(:mod:`.slurm` from ``scontrol``, :mod:`.jobmap` from the job-mapping directory), and its
GPU numbers resolved to devices (docs/slurm.md).

A :class:`JobGpus` is immutable: each poll makes a new one, and equal answers compare equal
(jobs in id order), so a poll that sees nothing change can keep the previous one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from ..devices import DeviceId


class SlurmError(Exception):
    """Slurm could not say (controller unreachable, command missing, timeout, unreadable)."""


class JobSource(Protocol):
    """What an allocation source polls, on a worker thread: :class:`~.slurm.SlurmReader` or
    :class:`~.jobmap.JobMapReader`. ``read`` raises :class:`SlurmError` when it cannot say."""

    def read(self) -> JobGpus: ...


class GpuOrder(Enum):
    """What a job's GPU numbers count."""

    GRES = "gres"  # Slurm's IDX: the position in the node's GRES device list
    NVML = "nvml"  # the NVML (DCGM) index: dcgm-exporter's mapping-file names


@dataclass(frozen=True)
class SlurmJob:
    """One job holding GPUs on this node."""

    job_id: str  # the raw id (SLURM_JOB_ID)
    gpus: tuple[int, ...]  # sorted, in the JobGpus' order
    user: str = ""
    account: str = ""
    partition: str = ""
    array: str = ""  # "<array job id>_<task id>" for an array task
    het: str = ""  # "<het job id>+<offset>" for a heterogeneous-job component
    # GPUs held through gres/shard (several jobs on one GPU, as time-slicing): a shard's IDX
    # is its GPU's position in the node's gpu GRES list, as ``gpus`` counts.
    shards: tuple[int, ...] = ()
    gpu_types: tuple[str, ...] = ()  # the GRES types its GPU entries name (gpu:<type>:n)


@dataclass(frozen=True)
class JobGpus:
    """The jobs holding GPUs on this node, from one source at one moment."""

    jobs: tuple[SlurmJob, ...] = ()  # sorted by job id
    order: GpuOrder = GpuOrder.GRES
    skipped: tuple[tuple[str, int], ...] = ()  # (reason, count) of what could not be read
    # The node's gpu GRES as (type, count) in Slurm's IDX order (``scontrol show node``'s
    # ``Gres=``), read when a job names a type: () when not read.
    layout: tuple[tuple[str, int], ...] = field(default=())

    def holders(self, gpu: int) -> tuple[SlurmJob, ...]:
        """The jobs holding GPU number ``gpu`` (several only on a shared GPU)."""
        return tuple(job for job in self.jobs if gpu in job.gpus)

    def by_gpu(self) -> dict[int, tuple[str, ...]]:
        """GPU number -> the ids of the jobs holding it."""
        held: dict[int, list[str]] = {}
        for job in self.jobs:
            for gpu in job.gpus:
                held.setdefault(gpu, []).append(job.job_id)
        return {gpu: tuple(ids) for gpu, ids in sorted(held.items())}

    def skips(self) -> dict[str, int]:
        return dict(self.skipped)


def job_gpus(
    jobs: Iterable[SlurmJob],
    order: GpuOrder,
    skipped: Mapping[str, int] | None = None,
    layout: Sequence[tuple[str, int]] = (),
) -> JobGpus:
    """A :class:`JobGpus` in canonical order (equal answers compare equal)."""
    ordered = sorted(jobs, key=lambda j: (_id_key(j.job_id), j.job_id))
    return JobGpus(tuple(ordered), order, tuple(sorted((skipped or {}).items())), tuple(layout))


def _id_key(job_id: str) -> tuple[int, int]:
    return (0, int(job_id)) if job_id.isdigit() else (1, 0)


@dataclass(frozen=True)
class JobHolding:
    """One job holding one device."""

    device: DeviceId
    job: SlurmJob


@dataclass(frozen=True)
class ResolvedJobs:
    holdings: tuple[JobHolding, ...] = ()
    unresolved: tuple[tuple[str, int], ...] = ()  # (job id, GPU number)
    # The devices Slurm hands out (gpu_allocated): whole GPUs, and MIG instances where the
    # node's GRES has MIG types; and the GPUs held through shards (shared, as time-slicing).
    schedulable: tuple[DeviceId, ...] = ()
    shared: frozenset[str] = frozenset()


# A GRES type naming a MIG profile: hand-written gres.conf types (``3g.40gb``) and
# AutoDetect=nvml's ``<model>_<profile>`` (``a100_3g.20gb``).
_MIG_TYPE = re.compile(r"(?:^|_)(?P<profile>\d+g\.\d+gb(?:\+me)?)$", re.IGNORECASE)


def mig_profile_of(gres_type: str) -> str | None:
    """The MIG profile a GRES type names (``a100_3g.20gb`` -> ``3g.20gb``), or None."""
    match = _MIG_TYPE.search(gres_type)
    return match["profile"].lower() if match is not None else None


def gres_order(gpus: Sequence[DeviceId]) -> list[DeviceId]:
    """Whole GPUs in Slurm's GRES order: by device minor (gres.conf and ``AutoDetect=nvml``
    name ``/dev/nvidia<minor>``), by NVML index when NVML does not tell a minor."""
    whole = [g for g in gpus if not g.is_mig]
    if any(g.minor is None for g in whole):
        return sorted(whole, key=lambda g: g.index)
    return sorted(whole, key=lambda g: (g.minor or 0, g.index))


def gres_devices(
    gpus: Sequence[DeviceId], layout: Sequence[tuple[str, int]]
) -> list[DeviceId | None]:
    """The node's gpu GRES in Slurm's IDX order, as devices.

    Slurm numbers a node's gpu GRES type by type, in the order its ``Gres=`` lists them (each
    type's devices in gres.conf order; verified on 22.05: a MIG type declared between two
    lines of whole GPUs still numbers after all of them). A MIG type's entries are the node's
    instances of that profile, by GPU (device minor) and GPU instance id; any other type's the
    next whole GPUs not in MIG mode, by :func:`gres_order`. Without MIG types (or a layout),
    every position is a whole GPU. A position no device fills is None (unresolved)."""
    ordered = gres_order(gpus)
    if not any(mig_profile_of(gres_type) for gres_type, _ in layout):
        return list(ordered)
    whole = iter([g for g in ordered if g.mig_mode != "enabled"])
    rank = {g.uuid: (g.minor if g.minor is not None else g.index, g.index) for g in ordered}
    instances = sorted(
        (d for d in gpus if d.is_mig),
        key=lambda d: (rank.get(d.parent_uuid or "", (d.index, d.index)), d.gpu_instance_id or 0),
    )
    by_profile: dict[str, list[DeviceId]] = {}
    for instance in instances:
        by_profile.setdefault((instance.mig_profile or "").lower(), []).append(instance)
    listed: list[DeviceId | None] = []
    for gres_type, count in layout:
        profile = mig_profile_of(gres_type)
        source = iter(by_profile.pop(profile, [])) if profile is not None else whole
        listed.extend(next(source, None) for _ in range(count))
    return listed


def resolve(found: JobGpus, gpus: Sequence[DeviceId]) -> ResolvedJobs:
    """Each job's GPU numbers -> devices, and its shards' GPUs (shared holdings).

    GRES numbers are positions in :func:`gres_devices` (whole GPUs by :func:`gres_order`,
    which assumes gres.conf lists every GPU of the node, and MIG instances where the node's
    layout has MIG types); NVML numbers are NVML indices of whole GPUs. A number matching no
    device, or a shard naming a MIG instance, is unresolved."""
    if found.order is GpuOrder.GRES:
        listed = gres_devices(gpus, found.layout)
        by_number = {n: d for n, d in enumerate(listed) if d is not None}
        schedulable = tuple(
            sorted((d for d in listed if d is not None), key=lambda d: (d.index, d.uuid))
        )
    else:
        by_number = {g.index: g for g in gpus if not g.is_mig}
        schedulable = tuple(g for g in gpus if not g.is_mig)
    holdings: list[JobHolding] = []
    unresolved: list[tuple[str, int]] = []
    shared: set[str] = set()
    for job in found.jobs:
        for number in job.gpus:
            device = by_number.get(number)
            if device is None:
                unresolved.append((job.job_id, number))
            else:
                holdings.append(JobHolding(device, job))
        for number in job.shards:
            device = by_number.get(number)
            if device is None or device.is_mig:
                unresolved.append((job.job_id, number))
            else:
                holdings.append(JobHolding(device, job))
                shared.add(device.uuid)
    return ResolvedJobs(tuple(holdings), tuple(unresolved), schedulable, frozenset(shared))
