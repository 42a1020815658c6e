"""Xids on a Slurm node, whose holders are jobs: the series name the job in ``job_id`` with the
pod labels empty, keep it across restarts in a form an older exporter still reads, and leave
after the retention as a pod's do (docs/slurm.md, "Xids")."""

from __future__ import annotations

import json
from pathlib import Path

from gpu_exporter.xid import XidCore, load_classifier
from gpu_exporter.xid.core import SOURCE_KMSG, Observation
from gpu_exporter.xid.journal import LOG_NAME, SNAPSHOT_NAME, Journal
from gpu_exporter.xid.metrics import render
from gpu_exporter.xid.nvml_events import Inventory
from gpu_exporter.xid.ops import Count, CountKey, decode

from .conftest import GPU0, Make, value

DAY = 86400.0
T0 = 1_700_000_000.0
JOB_XID = CountKey("0", GPU0.uuid, "13", "application", "restart_app", "", "", "4242")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class JobsByPid:
    """What the allocation subsystem answers on a Slurm node: pid 7 runs in job 4242, given
    as the holder key ("", job id); any other pid in no job."""

    def holder(self, uuid: str, at_wall_time: float, pid: int | None) -> tuple[str, str] | None:
        return ("", "4242") if pid == 7 else None


def job_core(state_dir: Path, clock: Clock) -> XidCore:
    journal = Journal(state_dir)
    core = XidCore(
        load_classifier(), journal, holders=lambda: JobsByPid(), job_holders=True, clock=clock
    )
    core.load("boot-1")
    return core


def xid(seq: int, when: float, pid: int) -> Observation:
    return Observation(
        source=SOURCE_KMSG,
        channel="kmsg",
        xid=13,
        when=when,
        device=GPU0,
        gpu_uuid=GPU0.uuid,
        pid=pid,
        kmsg=("boot-1", seq, 0.0, None, None),
    )


def exposition(core: XidCore) -> set[str]:
    return {
        f"{s.family.name}{{{s.labels}}}"
        for s in render(core.published, Inventory(), {}, ())
        if s.family.name == "gpu_xid_errors_total"
    }


def test_a_jobs_xid_names_the_job_in_job_id_with_the_pod_labels_empty(state_dir: Path) -> None:
    core = job_core(state_dir, Clock())
    core.observe([xid(1, T0, pid=7), xid(2, T0 + 60, pid=99)])
    common = 'gpu="0",uuid="GPU-0000",xid="13",class="application",action="restart_app"'
    assert exposition(core) == {
        f'gpu_xid_errors_total{{{common},namespace="",pod="",job_id="4242"}}',
        f'gpu_xid_errors_total{{{common},namespace="",pod=""}}',
    }, "the job's Xid and the unattributed one"


def test_a_jobs_series_survives_a_restart_in_a_form_older_exporters_read(state_dir: Path) -> None:
    clock = Clock()
    core = job_core(state_dir, clock)
    core.observe([xid(1, T0, pid=7)])
    (line,) = (state_dir / LOG_NAME).read_text().splitlines()
    record = json.loads(line)
    assert record["l"] == list(JOB_XID[:7]), "the seven labels every version reads"
    assert record["j"] == "4242", "the job, under a key older versions ignore"
    _, op = decode(record)
    assert isinstance(op, Count)
    assert op.labels == JOB_XID

    replayed = job_core(state_dir, clock)  # a crash: the op log replayed
    assert dict(replayed.published.counts) == {JOB_XID: 1.0}
    replayed.close()

    compacted = job_core(state_dir, clock)  # load() compacted the log into the snapshot
    snapshot = json.loads((state_dir / SNAPSHOT_NAME).read_text())
    assert snapshot["counts"] == [], "a job's row is not in the table older exporters read"
    assert snapshot["job_counts"] == [[*JOB_XID, 1.0]]
    assert dict(compacted.published.counts) == {JOB_XID: 1.0}


def test_a_jobs_series_leaves_after_the_retention_and_its_class_total_stays(
    state_dir: Path,
) -> None:
    clock = Clock()
    core = job_core(state_dir, clock)
    core.observe([xid(1, T0, pid=7), xid(2, T0, pid=99)])
    clock.now = T0 + 7 * DAY + 1
    core.expire_pod_series(7 * DAY)
    assert set(core.published.counts) == {JOB_XID._replace(job_id="")}, (
        "the job's series is bounded as a pod's is; the unattributed one stays"
    )
    assert core.published.class_counts[("", "", "application")] == 2
    assert set(job_core(state_dir, clock).published.counts) == {JOB_XID._replace(job_id="")}


async def test_the_subsystem_labels_job_holders_when_told_its_holders_are_jobs(
    make_subsystem: Make,
) -> None:
    subsystem = make_subsystem(kmsg_path=None, holders=lambda: JobsByPid(), job_holders=True)
    await subsystem.start()
    try:
        subsystem.core.observe([xid(1, T0, pid=7)])
        assert value(subsystem, "gpu_xid_errors_total", job_id="4242", pod="") == 1
    finally:
        await subsystem.stop()
