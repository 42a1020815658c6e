"""Against the one-node Slurm cluster: what the readers say while jobs start, run and end
agrees with Slurm's own view and with the mapping directory the shipped prolog writes."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpu_exporter.allocation.jobgpus import JobGpus, SlurmError, SlurmJob
from gpu_exporter.allocation.jobmap import read_job_map
from gpu_exporter.allocation.jobprocs import read_process_job
from gpu_exporter.allocation.slurm import JSON_COMMAND, SlurmForm, SlurmReader

from .cluster import NODE, ClusterError, SlurmCluster, free_ports, wait_until

GATED = "while [ -e {gate} ]; do sleep 0.1; done"


def reader(
    cluster: SlurmCluster,
    form: SlurmForm = SlurmForm.TEXT,
    json_command: Sequence[str] = JSON_COMMAND,
) -> SlurmReader:
    return SlurmReader(NODE, form=form, env=cluster.env, json_command=json_command)


def by_job(found: JobGpus) -> dict[str, tuple[int, ...]]:
    return {job.job_id: job.gpus for job in found.jobs}


def test_a_job_holding_two_gpus_appears_with_its_user_account_and_partition(
    slurm: SlurmCluster,
) -> None:
    job = slurm.submit("--gres=gpu:2", "--account=physics", "-p", "debug")
    slurm.wait_for_state(job, "RUNNING")
    found = reader(slurm).read()
    assert found.jobs == (SlurmJob(job, (0, 1), "root", "physics", "debug"),)


def test_the_json_form_agrees_with_the_text_form(slurm: SlurmCluster) -> None:
    jobs = [slurm.submit("--gres=gpu:2", "--account=a"), slurm.submit("--gres=gpu:3", "-A", "b")]
    for job in jobs:
        slurm.wait_for_state(job, "RUNNING")
    text = reader(slurm).read()
    squeue = reader(slurm, SlurmForm.JSON, json_command=("squeue", "--json")).read()
    assert len(text.jobs) == 2
    assert squeue == text


def test_auto_uses_scontrols_json_where_it_has_it_and_the_text_form_where_not(
    slurm: SlurmCluster,
) -> None:
    job = slurm.submit("--gres=gpu:1")
    slurm.wait_for_state(job, "RUNNING")
    auto = reader(slurm, SlurmForm.AUTO)
    assert auto.read() == reader(slurm).read()
    version = re.search(r"(\d+)\.(\d+)", slurm.run("scontrol", "--version"))
    assert version is not None
    has_json = (int(version[1]), int(version[2])) >= (23, 2)
    assert auto.form is (SlurmForm.JSON if has_json else SlurmForm.TEXT)


def test_a_finished_job_is_gone_in_the_next_read(slurm: SlurmCluster) -> None:
    gate = slurm.root / "gate"
    gate.touch()
    job = slurm.submit("--gres=gpu:2", "--account=physics", command=GATED.format(gate=gate))
    slurm.wait_for_state(job, "RUNNING")
    assert job in by_job(reader(slurm).read())
    gate.unlink()
    slurm.wait_for_state(job, "COMPLETED")
    assert "JobState=COMPLETED" in slurm.run("scontrol", "show", "job", job)  # still listed
    assert reader(slurm).read().jobs == ()


def test_the_mapping_directory_the_prolog_writes_gives_the_same_gpus(slurm: SlurmCluster) -> None:
    jobs = [
        slurm.submit("--gres=gpu:2"),
        slurm.submit("--gres=gpu:3"),
        slurm.submit("--gres=gpu:1"),
    ]
    for job in jobs:
        slurm.wait_for_state(job, "RUNNING")
    from_slurm = reader(slurm).read()
    from_files = read_job_map(slurm.job_map)
    assert by_job(from_files) == by_job(from_slurm)
    assert from_files.by_gpu() == from_slurm.by_gpu()
    assert from_files.skipped == ()
    slurm.cancel_all()
    # the epilog removed each job's files once the job ended
    assert read_job_map(slurm.job_map).jobs == ()


def test_a_jobs_process_maps_to_the_job_through_its_environment(slurm: SlurmCluster) -> None:
    # proctrack/linuxproc makes no job_<id> cgroup: SLURM_JOB_ID is the trace left.
    job = slurm.submit("--gres=gpu:1")
    slurm.wait_for_state(job, "RUNNING")
    pids = wait_until(lambda: _job_pids(slurm, job), f"job {job}'s processes", slurm)
    assert isinstance(pids, list)
    assert {read_process_job(Path("/proc"), pid) for pid in pids} == {job}


def test_an_unreachable_controller_is_an_error_within_the_timeout(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    (port,) = free_ports(1)
    conf = re.sub(r"SlurmctldPort=\d+", f"SlurmctldPort={port}", slurm.conf.read_text())
    (tmp_path / "slurm.conf").write_text(conf)
    env = {**slurm.env, "SLURM_CONF": str(tmp_path / "slurm.conf")}
    with pytest.raises(SlurmError, match="scontrol show job -d"):
        SlurmReader(NODE, form=SlurmForm.TEXT, env=env, timeout=3.0).read()


def test_a_missing_command_is_an_error_naming_it() -> None:
    missing = SlurmReader(NODE, form=SlurmForm.TEXT, text_command=("/nonexistent/scontrol",))
    with pytest.raises(SlurmError, match="/nonexistent/scontrol could not run"):
        missing.read()


def _job_pids(cluster: SlurmCluster, job: str) -> list[int]:
    """The job's processes as slurmd tracks them, the step daemon excluded."""
    try:
        out = cluster.run("scontrol", "listpids", job)
    except ClusterError:
        return []
    pids = [int(line.split()[0]) for line in out.splitlines()[1:] if line.split()]
    return [pid for pid in pids if _alive(pid)]


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()
