"""dcgm-exporter's HPC job-mapping directory (``--hpc-job-mapping-dir``) as a :class:`JobGpus`.

Slurm prolog and epilog scripts keep one file per GPU, named by its NVML (DCGM) index, each line
naming a job that holds the GPU: ``<job id>``, or ``<job id> <user>`` as some sites' scripts
write it (docs/slurm.md has the scripts). Sites that already run those scripts switch without
changes.

Everything a script or a user could leave there is bounded and never followed: at most
``max_files`` entries are looked at, a file over ``max_bytes`` is skipped, symbolic links and
anything but a regular file are skipped (opened with ``O_NOFOLLOW``, checked with ``fstat``),
names that are not a GPU index and lines that are not a job id are skipped; every skip is
counted by reason in :attr:`JobGpus.skipped`. Blocking file I/O: call it on a worker thread.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .jobgpus import GpuOrder, JobGpus, SlurmError, SlurmJob, job_gpus

MAX_FILES = 1024
MAX_FILE_BYTES = 64 * 1024
MAX_GPU_INDEX = 1023

# Skip reasons.
BAD_NAME = "bad_name"  # a name that is not a GPU index (dcgm-exporter ignores these too)
NOT_REGULAR = "not_regular"  # a symbolic link, directory, FIFO, device or socket
TOO_LARGE = "too_large"  # a file over max_bytes
UNREADABLE = "unreadable"  # gone between listing and opening, or no permission
BAD_LINE = "bad_line"  # a line that is not "<job id>" or "<job id> <user>"
TOO_MANY_FILES = "too_many_files"  # entries past max_files, not looked at

_JOB_ID = re.compile(r"[0-9]{1,20}(?:[_+][0-9]{1,10})?")
_USER = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class JobMapError(SlurmError):
    """The mapping directory itself cannot be read (missing, not a directory, no permission)."""


@dataclass(frozen=True)
class JobMapReader:
    """The mapping directory as a :class:`~.jobgpus.JobSource` (blocking: a worker thread)."""

    directory: Path
    max_files: int = MAX_FILES
    max_bytes: int = MAX_FILE_BYTES

    def read(self) -> JobGpus:
        return read_job_map(self.directory, max_files=self.max_files, max_bytes=self.max_bytes)


def read_job_map(
    directory: Path, *, max_files: int = MAX_FILES, max_bytes: int = MAX_FILE_BYTES
) -> JobGpus:
    """The jobs the mapping directory names, each with the NVML indices of its GPUs."""
    skipped: Counter[str] = Counter()
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise JobMapError(f"job mapping directory {directory}: {exc.strerror or exc}") from None
    gpus: dict[str, set[int]] = {}
    users: dict[str, str] = {}
    try:
        with os.scandir(dir_fd) as entries:
            for seen, entry in enumerate(entries):
                if seen >= max_files:
                    skipped[TOO_MANY_FILES] += 1
                    continue
                index = _gpu_index(entry.name)
                if index is None:
                    skipped[BAD_NAME] += 1
                    continue
                text = _read_bounded(dir_fd, entry.name, max_bytes, skipped)
                if text is None:
                    continue
                for job_id, user in _lines(text, skipped):
                    gpus.setdefault(job_id, set()).add(index)
                    users.setdefault(job_id, user)
    except OSError as exc:
        raise JobMapError(f"job mapping directory {directory}: {exc.strerror or exc}") from None
    finally:
        os.close(dir_fd)
    jobs = (
        SlurmJob(job_id, tuple(sorted(held)), user=users[job_id]) for job_id, held in gpus.items()
    )
    return job_gpus(jobs, GpuOrder.NVML, skipped)


def _gpu_index(name: str) -> int | None:
    """A decimal GPU index, as dcgm-exporter accepts it (no sign, no leading zeros)."""
    if not name.isascii() or not name.isdigit() or (len(name) > 1 and name.startswith("0")):
        return None
    index = int(name)
    return index if index <= MAX_GPU_INDEX else None


def _read_bounded(dir_fd: int, name: str, max_bytes: int, skipped: Counter[str]) -> str | None:
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        # ELOOP: a symbolic link (O_NOFOLLOW); ENXIO: a socket
        skipped[NOT_REGULAR if exc.errno in (errno.ELOOP, errno.ENXIO) else UNREADABLE] += 1
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            skipped[NOT_REGULAR] += 1
            return None
        data = os.read(fd, max_bytes + 1)
    except OSError:
        skipped[UNREADABLE] += 1
        return None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        skipped[TOO_LARGE] += 1
        return None
    return data.decode("utf-8", "replace")


def _lines(text: str, skipped: Counter[str]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        user = fields[1] if len(fields) == 2 else ""
        if (
            len(fields) > 2
            or not _JOB_ID.fullmatch(fields[0])
            or (user and not _USER.fullmatch(user))
        ):
            skipped[BAD_LINE] += 1
            continue
        found.append((fields[0], user))
    return found
