"""The allocation subsystem over a Slurm job source (a stand-in for scontrol here; the live
cluster's tests are tests/slurm/test_exporter.py): series per GPU stay bounded while jobs come
and go, and a source that fails or hangs goes down."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from gpu_exporter.allocation.jobgpus import GpuOrder, JobGpus, SlurmError, SlurmJob, job_gpus
from gpu_exporter.allocation.processes import GpuProcess
from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.devices import Device
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.nvml import WorkerPool

from .helpers import GPU_A, GPU_C, GPU_D, FakeClock, named, series

SOURCE_UP = 'gpu_exporter_source_up{source="slurm"}'
GIB = 1 << 30


def whole_gpus() -> list[Device]:
    return [Device(d, handle=None) for d in (GPU_A, GPU_C, GPU_D)]


class Jobs:
    """What the source answers next: jobs, an error, or a read that never returns."""

    def __init__(self) -> None:
        self.answer: JobGpus | Exception = job_gpus([], GpuOrder.NVML)
        self.release = threading.Event()
        self.returned = threading.Event()
        self.hang = False

    def read(self) -> JobGpus:
        if self.hang:
            self.release.wait(30)
            self.returned.set()
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def hold(self, *jobs: SlurmJob) -> None:
        self.answer = job_gpus(jobs, GpuOrder.NVML)


def subsystem(jobs: Jobs, pool: WorkerPool, clock: FakeClock) -> AllocationSubsystem:
    return AllocationSubsystem(
        AllocationSettings(
            socket_path=Path("/nonexistent"),
            poll_interval=1.0,
            call_timeout=0.5,
            process_interval=None,
        ),
        devices=whole_gpus,
        ledger=ActivityLedger(),
        executor=pool,
        clock=clock,
        jobs=jobs,
    )


async def test_series_per_gpu_stay_bounded_while_100_short_jobs_come_and_go(
    pool: WorkerPool,
) -> None:
    jobs, clock = Jobs(), FakeClock()
    sub = subsystem(jobs, pool, clock)
    most = 0
    for n in range(100):
        jobs.hold(SlurmJob(str(1000 + n), (0,), "u", f"acct-{n % 3}", "batch"))
        await sub.poll()
        clock.advance(2.0)  # past the poll interval: the previous job's counters leave
        sub.round_done()
        values = series(sub.samples())
        on_gpu0 = [k for k in values if 'gpu="0"' in k]
        most = max(most, len(on_gpu0))
        assert len(named(values, "gpu_slurm_job_info")) == 1, "a finished job's info stayed"
        finished = f'job_id="{1000 + n - 1}"'
        assert not [k for k in values if finished in k], "a finished job outlived one poll"
    await sub.stop()
    # gpu_allocated, the job's info, allocated and idle seconds and the idle streak, plus the
    # previous job's counters for at most one poll.
    assert most <= 8, f"{most} series on GPU 0"


async def test_a_job_is_labelled_by_job_id_only_on_the_accounting_series(pool: WorkerPool) -> None:
    jobs, clock = Jobs(), FakeClock()
    jobs.hold(SlurmJob("42", (0, 3), "alice", "physics", "gpu"))
    sub = subsystem(jobs, pool, clock)
    await sub.poll()
    values = series(sub.samples())
    await sub.stop()
    assert named(values, "gpu_slurm_job_info") == {
        'gpu_slurm_job_info{gpu="0",uuid="' + GPU_A.uuid + '",job_id="42",user="alice",'
        'account="physics",partition="gpu"}': 1,
        'gpu_slurm_job_info{gpu="3",uuid="' + GPU_D.uuid + '",job_id="42",user="alice",'
        'account="physics",partition="gpu"}': 1,
    }
    assert set(named(values, "gpu_allocated_seconds_total")) == {
        f'gpu_allocated_seconds_total{{gpu="0",uuid="{GPU_A.uuid}",job_id="42"}}',
        f'gpu_allocated_seconds_total{{gpu="3",uuid="{GPU_D.uuid}",job_id="42"}}',
    }
    assert named(values, "gpu_allocated")[f'gpu_allocated{{gpu="2",uuid="{GPU_C.uuid}"}}'] == 0
    assert sub.holders().holder(GPU_A.uuid, time.time()) == ("", "42"), "Xids would miss the job"


async def test_a_failing_or_hung_source_goes_down_and_withholds_the_jobs(pool: WorkerPool) -> None:
    jobs, clock = Jobs(), FakeClock()
    jobs.hold(SlurmJob("42", (0,)))
    sub = subsystem(jobs, pool, clock)
    await sub.poll()
    assert series(sub.samples())[SOURCE_UP] == 1
    jobs.answer = SlurmError("scontrol show job -d failed: Unable to contact slurm controller")
    await sub.poll()
    values = series(sub.samples())
    assert values[SOURCE_UP] == 0
    assert not named(values, "gpu_slurm_job_info"), "stale jobs served as current"
    jobs.hold(SlurmJob("42", (0,)))
    jobs.hang = True
    await sub.poll()  # given up after call_timeout, on the worker pool
    assert series(sub.samples())[SOURCE_UP] == 0
    await sub.poll()  # the stuck read is not started again beside itself
    assert series(sub.samples())[SOURCE_UP] == 0
    jobs.hang = False
    jobs.release.set()
    await asyncio.to_thread(jobs.returned.wait, 10)
    for _ in range(100):  # its future completes on the worker just after the read returns
        await sub.poll()
        if sub.published.up:
            break
    assert series(sub.samples())[SOURCE_UP] == 1
    await sub.stop()
    counted = series(sub.samples())['gpu_exporter_source_transitions_total{source="slurm"}']
    assert counted == 3  # up, down, up


async def test_processes_are_split_per_job_through_their_cgroup(
    pool: WorkerPool, tmp_path: Path
) -> None:
    """Two jobs time-share GPU 0: each process's job_<id> cgroup (cgroup v2 layout) names its
    job; a process in no job (a host daemon) is in none."""
    proc = tmp_path / "proc"
    cgroups = {
        100: "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
        101: "0::/system.slice/slurmstepd.scope/job_43/step_batch/user/task_0\n",
        102: "0::/system.slice/nvidia-persistenced.service\n",
    }
    for pid, text in cgroups.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    jobs, clock = Jobs(), FakeClock()
    jobs.hold(SlurmJob("42", (0,)), SlurmJob("43", (0,)))
    used = [GpuProcess(100, 3 * GIB), GpuProcess(101, GIB), GpuProcess(102, GIB)]
    sub = AllocationSubsystem(
        AllocationSettings(
            socket_path=Path("/nonexistent"),
            proc_path=proc,
            pod_logs_path=tmp_path / "pods",
        ),
        devices=whole_gpus,
        ledger=ActivityLedger(),
        executor=pool,
        process_lister=lambda device: used if device.uuid == GPU_A.uuid else [],
        clock=clock,
        jobs=jobs,
    )
    await sub.poll()
    await sub.scan_processes()
    values = series(sub.samples())
    await sub.stop()
    assert named(values, "gpu_container_memory_used_bytes") == {
        f'gpu_container_memory_used_bytes{{gpu="0",uuid="{GPU_A.uuid}",job_id="42"}}': 3 * GIB,
        f'gpu_container_memory_used_bytes{{gpu="0",uuid="{GPU_A.uuid}",job_id="43"}}': GIB,
    }
    holder = sub.holders().holder(GPU_A.uuid, time.time(), pid=101)
    assert holder == ("", "43"), "a PID singles out its job"
