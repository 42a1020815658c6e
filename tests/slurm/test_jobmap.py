"""dcgm-exporter's job-mapping directory read as jobs holding GPUs, and everything a script or a
user could leave in it skipped, counted, and never followed."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from gpu_exporter.allocation.jobgpus import GpuOrder, JobSource, SlurmError, SlurmJob
from gpu_exporter.allocation.jobmap import (
    BAD_LINE,
    BAD_NAME,
    NOT_REGULAR,
    TOO_LARGE,
    TOO_MANY_FILES,
    JobMapError,
    JobMapReader,
    read_job_map,
)


def write(directory: Path, name: str, text: str) -> None:
    (directory / name).write_text(text)


def test_each_file_names_the_jobs_holding_that_nvml_index(tmp_path: Path) -> None:
    write(tmp_path, "0", "17\n")
    write(tmp_path, "1", "17\n")
    write(tmp_path, "3", "18 alice\n")
    found = read_job_map(tmp_path)
    assert found.order is GpuOrder.NVML
    assert found.jobs == (SlurmJob("17", (0, 1)), SlurmJob("18", (3,), user="alice"))
    assert found.by_gpu() == {0: ("17",), 1: ("17",), 3: ("18",)}
    assert found.skipped == ()


def test_a_shared_gpu_file_names_several_jobs(tmp_path: Path) -> None:
    write(tmp_path, "2", "5\n6\n\n")
    assert [job.job_id for job in read_job_map(tmp_path).holders(2)] == ["5", "6"]


def test_an_empty_directory_is_no_jobs(tmp_path: Path) -> None:
    assert read_job_map(tmp_path).jobs == ()


def test_a_missing_directory_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(JobMapError, match=str(tmp_path / "absent")):
        read_job_map(tmp_path / "absent")


def test_the_reader_is_a_job_source_failing_as_slurm_sources_do(tmp_path: Path) -> None:
    write(tmp_path, "4", "17\n")
    source: JobSource = JobMapReader(tmp_path)
    assert source.read() == read_job_map(tmp_path)
    with pytest.raises(SlurmError):
        JobMapReader(tmp_path / "absent").read()


@pytest.mark.parametrize("name", ["gpu0", "-1", "01", ".0.17", "0.1", "GPU-8e1d", "٣", "99999"])
def test_names_that_are_not_a_gpu_index_are_skipped(tmp_path: Path, name: str) -> None:
    write(tmp_path, name, "17\n")
    found = read_job_map(tmp_path)
    assert (found.jobs, found.skips()) == ((), {BAD_NAME: 1})


def test_symbolic_links_are_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere"
    secret.write_text("17\n")
    mapping = tmp_path / "map"
    mapping.mkdir()
    (mapping / "0").symlink_to(secret)
    found = read_job_map(mapping)
    assert (found.jobs, found.skips()) == ((), {NOT_REGULAR: 1})


def test_directories_fifos_and_sockets_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "0").mkdir()
    os.mkfifo(tmp_path / "1")  # opening it must not block
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "2"))
    try:
        found = read_job_map(tmp_path)
    finally:
        listener.close()
    assert (found.jobs, found.skips()) == ((), {NOT_REGULAR: 3})


def test_a_file_over_the_size_bound_is_skipped(tmp_path: Path) -> None:
    write(tmp_path, "0", "17\n" * 100)
    write(tmp_path, "1", "18\n")
    found = read_job_map(tmp_path, max_bytes=64)
    assert (found.jobs, found.skips()) == ((SlurmJob("18", (1,)),), {TOO_LARGE: 1})


def test_entries_past_the_file_bound_are_not_looked_at(tmp_path: Path) -> None:
    for index in range(5):
        write(tmp_path, str(index), "17\n")
    found = read_job_map(tmp_path, max_files=3)
    assert len(found.jobs[0].gpus) == 3
    assert found.skips() == {TOO_MANY_FILES: 2}


def test_lines_that_are_not_a_job_id_are_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    write(tmp_path, "0", "17\nnot a job\n18 bob extra\n$(reboot)\n19_3\n20+1 carol\n")
    found = read_job_map(tmp_path)
    assert [(j.job_id, j.user) for j in found.jobs] == [("17", ""), ("19_3", ""), ("20+1", "carol")]
    assert found.skips() == {BAD_LINE: 3}


def test_undecodable_bytes_do_not_stop_the_read(tmp_path: Path) -> None:
    (tmp_path / "0").write_bytes(b"\xff\xfe\n17\n")
    found = read_job_map(tmp_path)
    assert found.jobs == (SlurmJob("17", (0,)),)
    assert found.skips() == {BAD_LINE: 1}
