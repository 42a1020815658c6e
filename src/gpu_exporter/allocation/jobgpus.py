"""Which GPUs each Slurm job on this node holds: the answer every Slurm source gives
(:mod:`.slurm` from ``scontrol``, :mod:`.jobmap` from the job-mapping directory), and its
GPU numbers resolved to devices (docs/slurm.md).

A :class:`JobGpus` is immutable: each poll makes a new one, and equal answers compare equal
(jobs in id order), so a poll that sees nothing change can keep the previous one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class JobGpus:
    """The jobs holding GPUs on this node, from one source at one moment."""

    jobs: tuple[SlurmJob, ...] = ()  # sorted by job id
    order: GpuOrder = GpuOrder.GRES
    skipped: tuple[tuple[str, int], ...] = ()  # (reason, count) of what could not be read

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
    jobs: Iterable[SlurmJob], order: GpuOrder, skipped: Mapping[str, int] | None = None
) -> JobGpus:
    """A :class:`JobGpus` in canonical order (equal answers compare equal)."""
    ordered = sorted(jobs, key=lambda j: (_id_key(j.job_id), j.job_id))
    return JobGpus(tuple(ordered), order, tuple(sorted((skipped or {}).items())))


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


def gres_order(gpus: Sequence[DeviceId]) -> list[DeviceId]:
    """Whole GPUs in Slurm's GRES order: by device minor (gres.conf and ``AutoDetect=nvml``
    name ``/dev/nvidia<minor>``), by NVML index when NVML does not tell a minor."""
    whole = [g for g in gpus if not g.is_mig]
    if any(g.minor is None for g in whole):
        return sorted(whole, key=lambda g: g.index)
    return sorted(whole, key=lambda g: (g.minor or 0, g.index))


def resolve(found: JobGpus, gpus: Sequence[DeviceId]) -> ResolvedJobs:
    """Each job's GPU numbers -> devices (whole GPUs: Slurm's MIG GRES is not read here).

    GRES numbers are positions in :func:`gres_order`, which assumes gres.conf lists every GPU
    of the node; NVML numbers are NVML indices. A number matching no GPU is unresolved."""
    if found.order is GpuOrder.GRES:
        by_number = dict(enumerate(gres_order(gpus)))
    else:
        by_number = {g.index: g for g in gpus if not g.is_mig}
    holdings: list[JobHolding] = []
    unresolved: list[tuple[str, int]] = []
    for job in found.jobs:
        for number in job.gpus:
            device = by_number.get(number)
            if device is None:
                unresolved.append((job.job_id, number))
            else:
                holdings.append(JobHolding(device, job))
    return ResolvedJobs(tuple(holdings), tuple(unresolved))
