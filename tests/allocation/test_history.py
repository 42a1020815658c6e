"""Who held a device at a given time: holder history and PID-based attribution."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_exporter.allocation.history import HolderHistory
from gpu_exporter.allocation.processes import GpuProcess
from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.devices import Device
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.nvml import WorkerPool

from .helpers import (
    GPU_A,
    GPU_C,
    MIG_1,
    MIG_2,
    MIG_B1,
    MIG_B2,
    UUID_A,
    UUID_B,
    UUID_C,
    FakeClock,
    FakeKubelet,
    devices,
)

TRAIN = ("ml", "train")
EVAL = ("ml", "eval")
SHARE_A = ("web", "share-a")
SHARE_B = ("web", "share-b")


def test_event_in_the_past_resolves_to_who_held_it_then() -> None:
    history = HolderHistory(slack=1.0)
    history.observe(100.0, {GPU_A: {TRAIN}})
    history.observe(150.0, {GPU_A: set()})  # train released (seen at 150)
    history.observe(160.0, {GPU_A: {EVAL}})
    assert history.snapshot().pods(UUID_A, 120.0) == {TRAIN}
    assert history.snapshot().pods(UUID_A, 155.0) == set()
    assert history.snapshot().pods(UUID_A, 170.0) == {EVAL}
    # within the slack of a late first sighting:
    assert history.snapshot().pods(UUID_A, 159.5) == {EVAL}
    assert history.snapshot().pods(UUID_A, 90.0) == set()


def test_mig_instances_answer_for_their_parent() -> None:
    history = HolderHistory()
    history.observe(100.0, {MIG_B1: {TRAIN}, MIG_B2: {EVAL}})
    assert history.snapshot().pods(MIG_1, 110.0) == {TRAIN}
    assert history.snapshot().pods(MIG_2, 110.0) == {EVAL}
    assert history.snapshot().pods(UUID_B, 110.0) == {TRAIN, EVAL}


def test_old_tenures_are_pruned() -> None:
    history = HolderHistory(retention=60.0)
    history.observe(0.0, {GPU_A: {TRAIN}})
    history.observe(10.0, {GPU_A: set()})
    assert history.snapshot().pods(UUID_A, 5.0) == {TRAIN}
    history.observe(100.0, {GPU_A: set()})
    assert history.snapshot().pods(UUID_A, 5.0) == set()


def test_a_snapshot_stays_as_it_was_while_the_history_moves_on() -> None:
    """What another thread holds (the Xid readers) is frozen: later polls make a new one."""
    history = HolderHistory(slack=1.0)
    assert history.observe(100.0, {GPU_A: {TRAIN}}), "a new tenure is a change"
    before = history.snapshot({4242: SHARE_B})
    assert history.observe(150.0, {GPU_A: set()}), "an ended tenure is a change"
    assert not history.observe(160.0, {GPU_A: set()}), "nothing new: no new snapshot is needed"
    assert before.holder(UUID_A, 200.0) == TRAIN  # the tenure as it was, still open
    assert history.snapshot().holder(UUID_A, 200.0) is None
    assert before.holder(UUID_C, 100.0, 4242) == SHARE_B  # a PID seen in a pod wins
    with pytest.raises(TypeError):
        before.by_pid[1] = TRAIN  # type: ignore[index]


class Processes:
    def __init__(self) -> None:
        self.by_uuid: dict[str, list[GpuProcess]] = {}

    def __call__(self, device: Device) -> list[GpuProcess]:
        return self.by_uuid.get(device.uuid, [])


async def test_holder_prefers_pid_on_shared_gpu(
    kubelet: FakeKubelet, pool: WorkerPool, tmp_path: Path
) -> None:
    from .test_memory import make_pod

    kubelet.hold("web", "share-a", "srv", "nvidia.com/gpu", f"{UUID_C}::0")
    kubelet.hold("web", "share-b", "srv", "nvidia.com/gpu", f"{UUID_C}::1")
    kubelet.hold("ml", "train", "main", "nvidia.com/gpu", UUID_A)
    processes = Processes()
    processes.by_uuid[UUID_C] = [GpuProcess(4242, 1 << 30)]
    make_pod(tmp_path, "web", "share-b", ["srv"], {4242: "srv"})
    wall = FakeClock(1_700_000_000.0)
    sub = AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket_path,
            proc_path=tmp_path / "proc",
            pod_logs_path=tmp_path / "pods",
        ),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
        process_lister=processes,
        wall_clock=wall,
    )
    await sub.poll()
    sub.round_done()
    await sub.scan_processes()
    now = wall.now
    assert sub.holders().holder(UUID_A, now, None) == TRAIN
    holders = sub.holders()
    assert holders.holder(UUID_A, now, 999) == TRAIN  # an unknown pid falls back to the history
    assert sub.holders().holder(UUID_C, now, None) is None  # two pods share it: ambiguous
    assert sub.holders().holder(UUID_C, now, 4242) == SHARE_B
    assert sub.holders().holder(UUID_C, now - 3600, None) is None  # before anyone held it
    kubelet.release("train")
    wall.advance(30)
    await sub.poll()  # sees the release 30 s on: the tenure ends there (the poll accounts at once)
    holders = sub.holders()
    assert holders.holder(UUID_A, now + 10, None) == TRAIN  # slightly in the past: still train
    assert sub.holders().holder(UUID_A, wall.now, None) is None
    assert (GPU_A.uuid, GPU_C.uuid) == (UUID_A, UUID_C)
    await sub.stop()
