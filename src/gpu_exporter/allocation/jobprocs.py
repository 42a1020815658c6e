"""From a host PID to its Slurm job: the ``job_<id>`` cgroup, else ``SLURM_JOB_ID`` in its
environment (docs/slurm.md).

With ``ProctrackType=proctrack/cgroup`` slurmd puts every process of a job in a cgroup whose path
has a ``job_<id>`` element: ``/slurm/uid_<uid>/job_<id>/step_<step>/task_<n>`` on cgroup v1,
``/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>`` on v2. With
``proctrack/linuxproc`` or ``pgid`` there is no such cgroup, and the job's environment is the
trace left: slurmstepd sets ``SLURM_JOB_ID`` for the processes it starts and their children
inherit it (a process may change or drop it, so the cgroup wins wherever it exists).

Blocking file I/O on ``/proc``: call these on a worker thread.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

MAX_ENVIRON_BYTES = 256 * 1024
_JOB = re.compile(r"/job_(?P<id>[0-9]{1,20})(?=/|$)")
_ENV_JOB = re.compile(rb"(?:^|\0)SLURM_JOB_ID=(?P<id>[0-9]{1,20})(?=\0|$)")


def parse_job_cgroup(text: str) -> str | None:
    """The job id in the content of ``/proc/<pid>/cgroup``; None when no line names a job."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        found = list(_JOB.finditer(parts[2]))
        if found:
            return found[-1]["id"]
    return None


def parse_job_environ(data: bytes) -> str | None:
    """``SLURM_JOB_ID`` in the NUL-separated content of ``/proc/<pid>/environ``."""
    match = _ENV_JOB.search(data)
    return match["id"].decode("ascii") if match is not None else None


def read_process_job(proc_path: Path, pid: int) -> str | None:
    """The job ``pid`` runs in: its cgroup, else its environment; None when neither says (a
    process outside any job) or the process is gone."""
    base = proc_path / str(pid)
    try:
        text = (base / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    job = parse_job_cgroup(text)
    if job is not None:
        return job
    try:
        with (base / "environ").open("rb") as environ:
            data = environ.read(MAX_ENVIRON_BYTES)
    except OSError:
        return None
    return parse_job_environ(data)


def read_process_jobs(proc_path: Path, pids: Iterable[int]) -> dict[int, str]:
    """PID -> job id for the PIDs that run in a job (a GPU scan's processes, say)."""
    jobs: dict[int, str] = {}
    for pid in pids:
        job = read_process_job(proc_path, pid)
        if job is not None:
            jobs[pid] = job
    return jobs
