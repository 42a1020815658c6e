"""A process's Slurm job: the ``job_<id>`` cgroup that proctrack/cgroup makes, else the
``SLURM_JOB_ID`` its environment carries (proctrack/linuxproc leaves no cgroup)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_exporter.allocation.jobprocs import (
    parse_job_cgroup,
    parse_job_environ,
    read_process_job,
    read_process_jobs,
)


@pytest.mark.parametrize(
    ("cgroup", "job"),
    [
        # cgroup v2, slurmd's own scope (Slurm 22.05 and later)
        ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", "4242"),
        ("0::/system.slice/slurmstepd.scope/job_7/step_batch/user/task_special\n", "7"),
        # cgroup v1, recorded from a job step on the test cluster with proctrack/cgroup
        # (Debian's build names the root slurm_<node>)
        (
            "7:blkio:/\n6:freezer:/slurm_gpunode1/uid_0/job_2/step_0\n5:devices:/\n0::/\n",
            "2",
        ),
        # cgroup v1: every controller hierarchy under /slurm/uid_<uid>/job_<id>/
        (
            "12:memory:/slurm/uid_1000/job_99/step_extern/task_0\n"
            "11:devices:/slurm/uid_1000/job_99/step_extern\n",
            "99",
        ),
        # seen from inside a cgroup namespace
        ("0::/../job_5/step_0/user/task_0\n", "5"),
        # not a job: a user slice, a pod, or a name that only contains job_
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("0::/kubepods.slice/kubepods-pod1234.slice\n", None),
        ("0::/system.slice/my_job_5.service\n", None),
        ("garbage\n", None),
    ],
)
def test_the_job_cgroup_names_the_job(cgroup: str, job: str | None) -> None:
    assert parse_job_cgroup(cgroup) == job


def test_the_environment_names_the_job_exactly() -> None:
    assert parse_job_environ(b"HOME=/root\0SLURM_JOB_ID=31\0SLURM_JOBID=31\0") == "31"
    assert parse_job_environ(b"SLURM_JOB_ID=8\0") == "8"
    assert parse_job_environ(b"MY_SLURM_JOB_ID=8\0SLURM_JOB_IDX=9\0") is None
    assert parse_job_environ(b"SLURM_JOB_ID=\0") is None


def fake_process(proc: Path, pid: int, cgroup: str, environ: bytes) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(cgroup)
    (proc / str(pid) / "environ").write_bytes(environ)


def test_the_cgroup_wins_over_the_environment(tmp_path: Path) -> None:
    fake_process(
        tmp_path, 10, "0::/system.slice/slurmstepd.scope/job_3/step_0\n", b"SLURM_JOB_ID=4\0"
    )
    assert read_process_job(tmp_path, 10) == "3"


def test_without_a_job_cgroup_the_environment_says(tmp_path: Path) -> None:
    fake_process(tmp_path, 11, "0::/\n", b"PATH=/bin\0SLURM_JOB_ID=4\0")
    assert read_process_job(tmp_path, 11) == "4"


def test_a_process_outside_any_job_or_gone_has_none(tmp_path: Path) -> None:
    fake_process(tmp_path, 12, "0::/\n", b"PATH=/bin\0")
    assert read_process_job(tmp_path, 12) is None
    assert read_process_job(tmp_path, 13) is None


def test_a_scan_maps_only_the_pids_that_run_in_a_job(tmp_path: Path) -> None:
    fake_process(tmp_path, 20, "0::/\n", b"SLURM_JOB_ID=4\0")
    fake_process(tmp_path, 21, "0::/\n", b"PATH=/bin\0")
    assert read_process_jobs(tmp_path, [20, 21, 22]) == {20: "4"}
