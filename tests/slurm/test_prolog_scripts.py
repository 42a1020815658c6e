"""The shipped prolog and epilog (deploy/slurm/) keep dcgm-exporter's job-mapping directory:
run here with the environment slurmd gives them (docs/slurm.md has it, as recorded)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpu_exporter.allocation.jobmap import read_job_map

SCRIPTS = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def run(script: str, directory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", str(SCRIPTS / f"{script}-gpu-job-map.sh")],
        env={"PATH": os.environ["PATH"], "GPU_JOB_MAP_DIR": str(directory), **env},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )


def test_the_prolog_names_the_job_in_each_of_its_gpus_files(tmp_path: Path) -> None:
    mapping = tmp_path / "map"
    done = run("prolog", mapping, SLURM_JOB_ID="41", SLURM_JOB_GPUS="2,3,4")
    assert done.returncode == 0
    assert sorted(p.name for p in mapping.iterdir()) == ["2", "3", "4"]
    assert read_job_map(mapping).by_gpu() == {2: ("41",), 3: ("41",), 4: ("41",)}


def test_without_slurm_job_gpus_the_prolog_takes_cuda_visible_devices(tmp_path: Path) -> None:
    run("prolog", tmp_path, SLURM_JOB_ID="42", CUDA_VISIBLE_DEVICES="5")
    assert read_job_map(tmp_path).by_gpu() == {5: ("42",)}


def test_a_job_without_gpus_writes_nothing(tmp_path: Path) -> None:
    assert run("prolog", tmp_path / "map", SLURM_JOB_ID="43").returncode == 0
    assert not (tmp_path / "map").exists()


def test_the_prolog_replaces_a_file_a_lost_epilog_left(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("7\n")
    run("prolog", tmp_path, SLURM_JOB_ID="44", SLURM_JOB_GPUS="0")
    assert (tmp_path / "0").read_text() == "44\n"


def test_the_epilog_removes_its_jobs_files_and_leaves_another_jobs(tmp_path: Path) -> None:
    run("prolog", tmp_path, SLURM_JOB_ID="45", SLURM_JOB_GPUS="0,1")
    run("prolog", tmp_path, SLURM_JOB_ID="46", SLURM_JOB_GPUS="1")  # GPU 1 went to job 46
    assert run("epilog", tmp_path, SLURM_JOB_ID="45", SLURM_JOB_GPUS="0,1").returncode == 0
    assert read_job_map(tmp_path).by_gpu() == {1: ("46",)}


def test_the_epilog_does_not_follow_a_symbolic_link(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("47\n")
    mapping = tmp_path / "map"
    mapping.mkdir()
    (mapping / "0").symlink_to(target)
    run("epilog", mapping, SLURM_JOB_ID="47", SLURM_JOB_GPUS="0")
    assert target.read_text() == "47\n"


def test_failures_exit_0_so_slurmd_does_not_drain_the_node(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # the directory path is a file: nothing can be written
    done = run("prolog", blocked / "map", SLURM_JOB_ID="48", SLURM_JOB_GPUS="0")
    assert done.returncode == 0
    assert run("epilog", blocked / "map", SLURM_JOB_ID="48", SLURM_JOB_GPUS="0").returncode == 0


def test_gpu_lists_that_are_not_indices_are_ignored(tmp_path: Path) -> None:
    run("prolog", tmp_path, SLURM_JOB_ID="49", SLURM_JOB_GPUS="0,../x,GPU-1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0"]


def test_a_mapping_directory_that_is_a_link_is_not_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "map").symlink_to(elsewhere)
    assert run("prolog", tmp_path / "map", SLURM_JOB_ID="50", SLURM_JOB_GPUS="0").returncode == 0
    assert list(elsewhere.iterdir()) == []
