"""DRA holders in the same accounting as device-plugin holders, over real gRPC."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gpu_exporter.allocation.model import PodKey
from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.devices import Device
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.nvml import WorkerPool

from .helpers import (
    INVENTORY,
    MIG_2,
    UUID_A,
    UUID_C,
    FakeClock,
    FakeKubelet,
    named,
    series,
)
from .test_podresources import MIG2_LABELS, SOURCE_UP

# Minors differ from NVML indexes: A is /dev/nvidia4, B (MIG mode) /dev/nvidia0, C /dev/nvidia7.
MINORS = {0: 4, 1: 0, 2: 7, 3: 5}
PLACEMENTS = {MIG_2: (19, 6, 1)}  # MIG_2 (1g.10gb on B): GI profile 19, placement start 6
A_LABELS = f'gpu="0",uuid="{UUID_A}"'
C_LABELS = f'gpu="2",uuid="{UUID_C}"'
UNRESOLVED = "gpu_exporter_allocation_unresolved_total"


def devices() -> list[Device]:
    return [
        Device(
            dataclasses.replace(d, minor=MINORS[d.index], placement=PLACEMENTS.get(d.uuid)),
            handle=None,
        )
        for d in INVENTORY
    ]


def subsystem(
    kubelet: FakeKubelet, pool: WorkerPool, clock: FakeClock, self_pod: PodKey | None = None
) -> AllocationSubsystem:
    return AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket_path,
            call_timeout=1.0,
            process_interval=None,
            proc_path=Path("/nonexistent"),
            pod_logs_path=Path("/nonexistent"),
            cdi_spec_dirs=(Path("/nonexistent"),),  # no specs: device names resolve
            mig_minors_path=Path("/nonexistent"),
            self_pod=self_pod,
        ),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
        clock=clock,
        wall_clock=clock,
    )


async def step(
    sub: AllocationSubsystem, clock: FakeClock, seconds: float = 10.0
) -> dict[str, float]:
    clock.advance(seconds)
    await sub.poll()
    sub.round_done()
    return series(sub.samples())


async def test_claimed_gpus_are_allocated_held_and_accounted(
    kubelet: FakeKubelet, pool: WorkerPool
) -> None:
    kubelet.allocatable = []  # no device plugin on a DRA node
    kubelet.claim(("ml", "train", "trainer"), ("ml", "train-gpu"), "gpu-4")
    kubelet.claim(("batch", "small", "main"), ("batch", "mig"), "gpu-0-mig-1g10gb-19-6")
    kubelet.claim(("ml", "train", "trainer"), ("ml", "imex"), "channel-0",
                  driver="compute-domain.nvidia.com")  # fmt: skip
    clock = FakeClock()
    sub = subsystem(kubelet, pool, clock)
    await step(sub, clock)
    values = await step(sub, clock)
    assert values[SOURCE_UP] == 1
    assert named(values, "gpu_allocation_info") == {
        f'gpu_allocation_info{{{A_LABELS},namespace="ml",pod="train",container="trainer",'
        'resource="dra:ml/train-gpu",source="dra"}': 1,
        f'gpu_allocation_info{{{MIG2_LABELS},namespace="batch",pod="small",container="main",'
        'resource="dra:batch/mig",source="dra"}': 1,
    }
    allocated = named(values, "gpu_allocated")
    assert allocated[f"gpu_allocated{{{A_LABELS}}}"] == 1
    assert allocated[f"gpu_allocated{{{MIG2_LABELS}}}"] == 1
    assert allocated[f"gpu_allocated{{{C_LABELS}}}"] == 0, "the inventory lists the free GPUs"
    seconds = f'gpu_allocated_seconds_total{{{A_LABELS},namespace="ml",pod="train"}}'
    assert values[seconds] == 10.0
    # The holder history serves Xid attribution for DRA holders as for any other.
    assert sub.holders().holder(UUID_A, clock()) == ("ml", "train")
    assert sub.holders().holder(MIG_2, clock()) == ("batch", "small")
    assert values[f'{UNRESOLVED}{{reason="unknown_device_name"}}'] == 0
    await sub.stop()


async def test_two_pods_on_one_claim_share_the_gpu(kubelet: FakeKubelet, pool: WorkerPool) -> None:
    kubelet.claim(("research", "nb-a", "notebook"), ("research", "shared"), "gpu-7")
    kubelet.claim(("research", "nb-b", "notebook"), ("research", "shared"), "gpu-7")
    clock = FakeClock()
    sub = subsystem(kubelet, pool, clock)
    await step(sub, clock)
    values = await step(sub, clock)
    info = named(values, "gpu_allocation_info")
    assert set(info) == {
        f'gpu_allocation_info{{{C_LABELS},namespace="research",pod="{p}",container="notebook",'
        'resource="dra:research/shared",source="dra"}'
        for p in ("nb-a", "nb-b")
    }
    for p in ("nb-a", "nb-b"):  # each holder accrues its own allocated time
        assert (
            values[f'gpu_allocated_seconds_total{{{C_LABELS},namespace="research",pod="{p}"}}']
            == 10
        )
    holders = sub.published.allocations.pods_by_device()[UUID_C]
    assert holders == {("research", "nb-a"), ("research", "nb-b")}
    assert {h.claim for h in sub.published.allocations.holdings} == {("research", "shared")}
    assert sub.holders().holder(UUID_C, clock()) is None, "two holders: attribution needs a PID"
    await sub.stop()


async def test_the_exporters_own_pod_is_not_a_holder(
    kubelet: FakeKubelet, pool: WorkerPool
) -> None:
    # A monitoring agent's admin-access claim on every GPU (reference/dra.md, section 3).
    for minor in (4, 7, 5):
        kubelet.claim(("monitoring", "gpu-exporter-x", "gpu-exporter"), ("monitoring", "all"),
                      f"gpu-{minor}")  # fmt: skip
    kubelet.claim(("ml", "train", "trainer"), ("ml", "train-gpu"), "gpu-4")
    clock = FakeClock()
    sub = subsystem(kubelet, pool, clock, self_pod=("monitoring", "gpu-exporter-x"))
    values = await step(sub, clock)
    assert {k for k in named(values, "gpu_allocation_info")} == {
        f'gpu_allocation_info{{{A_LABELS},namespace="ml",pod="train",container="trainer",'
        'resource="dra:ml/train-gpu",source="dra"}'
    }
    assert values[f"gpu_allocated{{{C_LABELS}}}"] == 0
    await sub.stop()


async def test_an_unresolvable_claim_counts_once_while_it_lasts(
    kubelet: FakeKubelet, pool: WorkerPool
) -> None:
    kubelet.claim(("lab", "odd", "main"), ("lab", "odd"), "accelerator-7")
    kubelet.claim(("lab", "vm", "main"), ("lab", "vm"), "gpu-vfio-0")
    kubelet.hold("lab", "old", "main", "nvidia.com/gpu", "GPU-nothing-like-it")
    clock = FakeClock()
    sub = subsystem(kubelet, pool, clock)
    for _ in range(3):
        values = await step(sub, clock)
    counts = {k: v for k, v in named(values, UNRESOLVED).items() if v}
    assert counts == {
        f'{UNRESOLVED}{{reason="unknown_device_name"}}': 1,
        f'{UNRESOLVED}{{reason="vfio_passthrough"}}': 1,
        f'{UNRESOLVED}{{reason="unknown_device_id"}}': 1,
    }
    kubelet.release("odd")  # gone, and back: a new occurrence
    await step(sub, clock)
    kubelet.claim(("lab", "odd", "main"), ("lab", "odd"), "accelerator-7")
    values = await step(sub, clock)
    assert values[f'{UNRESOLVED}{{reason="unknown_device_name"}}'] == 2
    await sub.stop()


async def test_the_count_is_published_while_the_kubelet_is_down(
    short_dir: Path, pool: WorkerPool
) -> None:
    sub = subsystem(FakeKubelet(short_dir / "absent.sock"), pool, FakeClock())
    await sub.poll()
    values = series(sub.samples())
    assert values[SOURCE_UP] == 0
    assert values[f'{UNRESOLVED}{{reason="no_such_device"}}'] == 0
    await sub.stop()
