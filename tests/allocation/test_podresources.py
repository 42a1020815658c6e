"""The subsystem against a real pod-resources gRPC server on a temporary unix socket."""

from __future__ import annotations

from pathlib import Path

import pytest
from grpclib.const import Status

from gpu_exporter.allocation.samples import UNRESOLVED_REASONS
from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.nvml import WorkerPool
from gpu_exporter.simulator.podresources_server import ALLOCATABLE_DISABLED

from .helpers import (
    MIG_1,
    MIG_2,
    UUID_A,
    UUID_B,
    UUID_C,
    UUID_D,
    FakeClock,
    FakeKubelet,
    devices,
    named,
    series,
)

SOURCE_UP = 'gpu_exporter_source_up{source="pod_resources"}'
MIG1_LABELS = (
    f'gpu="1",uuid="{MIG_1}",gpu_instance_id="1",compute_instance_id="0",mig_profile="3g.40gb"'
)
MIG2_LABELS = (
    f'gpu="1",uuid="{MIG_2}",gpu_instance_id="2",compute_instance_id="0",mig_profile="1g.10gb"'
)
ALLOCATION_SERIES = (
    "gpu_allocation_info",
    "gpu_allocated",
    "gpu_allocated_seconds_total",
    "gpu_allocated_idle_seconds_total",
    "gpu_allocation_idle_streak_seconds",
)


def subsystem(
    kubelet: FakeKubelet, pool: WorkerPool, clock: FakeClock | None = None
) -> AllocationSubsystem:
    return AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket_path,
            call_timeout=1.0,
            poll_interval=0.05,
            process_interval=60.0,
            proc_path=Path("/nonexistent"),
            pod_logs_path=Path("/nonexistent"),
        ),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
        clock=clock or FakeClock(),
    )


def every_id_form(kubelet: FakeKubelet) -> None:
    kubelet.hold("ml", "train", "trainer", "nvidia.com/gpu", UUID_A)
    kubelet.hold("batch", "single", "main", "nvidia.com/gpu", MIG_1)  # MIG "single" strategy
    kubelet.hold("batch", "mixed", "main", "nvidia.com/mig-1g.10gb", MIG_2)  # "mixed"
    kubelet.hold("web", "share-a", "srv", "nvidia.com/gpu", f"{UUID_C}::0")
    kubelet.hold("web", "share-b", "srv", "nvidia.com/gpu.shared", f"{UUID_C}::3")
    kubelet.hold("web", "share-b", "side", "nvidia.com/gpu.shared", f"{UUID_C}::4")
    kubelet.hold("net", "router", "main", "example.com/nic", "eth0")  # not a GPU: ignored
    kubelet.allocatable = [
        ("nvidia.com/gpu", UUID_A),
        ("nvidia.com/gpu", MIG_1),
        ("nvidia.com/mig-1g.10gb", MIG_2),
        *[("nvidia.com/gpu.shared", f"{UUID_C}::{n}") for n in range(8)],
        ("nvidia.com/gpu", UUID_D),
        ("example.com/nic", "eth0"),
    ]


async def test_every_id_form(kubelet: FakeKubelet, pool: WorkerPool) -> None:
    every_id_form(kubelet)
    sub = subsystem(kubelet, pool)
    await sub.poll()
    sub.round_done()
    values = series(sub.samples())
    assert values[SOURCE_UP] == 1
    assert named(values, "gpu_allocation_info") == {
        f'gpu_allocation_info{{gpu="0",uuid="{UUID_A}",namespace="ml",pod="train",'
        'container="trainer",resource="nvidia.com/gpu",source="pod-resources"}': 1,
        f'gpu_allocation_info{{{MIG1_LABELS},namespace="batch",pod="single",'
        'container="main",resource="nvidia.com/gpu",source="pod-resources"}': 1,
        f'gpu_allocation_info{{{MIG2_LABELS},namespace="batch",pod="mixed",'
        'container="main",resource="nvidia.com/mig-1g.10gb",source="pod-resources"}': 1,
        f'gpu_allocation_info{{gpu="2",uuid="{UUID_C}",namespace="web",pod="share-a",'
        'container="srv",resource="nvidia.com/gpu",source="pod-resources"}': 1,
        f'gpu_allocation_info{{gpu="2",uuid="{UUID_C}",namespace="web",pod="share-b",'
        'container="srv",resource="nvidia.com/gpu.shared",source="pod-resources"}': 1,
        f'gpu_allocation_info{{gpu="2",uuid="{UUID_C}",namespace="web",pod="share-b",'
        'container="side",resource="nvidia.com/gpu.shared",source="pod-resources"}': 1,
    }
    assert named(values, "gpu_allocated") == {
        f'gpu_allocated{{gpu="0",uuid="{UUID_A}"}}': 1,
        f"gpu_allocated{{{MIG1_LABELS}}}": 1,
        f"gpu_allocated{{{MIG2_LABELS}}}": 1,
        f'gpu_allocated{{gpu="2",uuid="{UUID_C}"}}': 1,
        f'gpu_allocated{{gpu="3",uuid="{UUID_D}"}}': 0,
    }
    # One counter per (device, pod): the two time-sliced pods each have theirs.
    pods = {k for k in named(values, "gpu_allocated_seconds_total")}
    assert len(pods) == 5
    await sub.stop()


async def test_gke_ids(kubelet: FakeKubelet, pool: WorkerPool) -> None:
    kubelet.hold("ml", "train", "main", "nvidia.com/gpu", "nvidia0")
    kubelet.hold("ml", "mig", "main", "nvidia.com/gpu", "nvidia1/gi2")
    kubelet.hold("ml", "shared", "main", "nvidia.com/gpu", "nvidia2/vgpu1")
    kubelet.allocatable = None  # an older kubelet: schedulable devices come from the inventory
    sub = subsystem(kubelet, pool)
    await sub.poll()
    sub.round_done()
    allocated = named(series(sub.samples()), "gpu_allocated")
    assert allocated == {
        f'gpu_allocated{{gpu="0",uuid="{UUID_A}"}}': 1,
        f"gpu_allocated{{{MIG1_LABELS}}}": 0,
        f"gpu_allocated{{{MIG2_LABELS}}}": 1,
        f'gpu_allocated{{gpu="2",uuid="{UUID_C}"}}': 1,
        f'gpu_allocated{{gpu="3",uuid="{UUID_D}"}}': 0,
    }
    assert f'uuid="{UUID_B}"' not in "".join(allocated)  # a GPU in MIG mode is not schedulable
    await sub.stop()


async def test_a_kubelet_with_get_allocatable_disabled_stays_a_source(
    kubelet: FakeKubelet, pool: WorkerPool
) -> None:
    """The feature gate off: UNKNOWN "... disabled" from GetAllocatableResources, List answers."""
    every_id_form(kubelet)
    kubelet.allocatable = None
    kubelet.refusal = ALLOCATABLE_DISABLED
    sub = subsystem(kubelet, pool)
    await sub.poll()
    sub.round_done()
    values = series(sub.samples())
    assert values[SOURCE_UP] == 1, "a disabled GetAllocatableResources took the source down"
    assert values[f'gpu_allocated{{gpu="0",uuid="{UUID_A}"}}'] == 1
    assert values[f'gpu_allocated{{gpu="3",uuid="{UUID_D}"}}'] == 0  # from the inventory
    await sub.stop()


async def test_other_get_allocatable_errors_still_take_the_source_down(
    kubelet: FakeKubelet, pool: WorkerPool
) -> None:
    every_id_form(kubelet)
    kubelet.allocatable = None
    kubelet.refusal = (Status.UNKNOWN, "something else broke")
    sub = subsystem(kubelet, pool)
    await sub.poll()
    sub.round_done()
    assert series(sub.samples())[SOURCE_UP] == 0
    await sub.stop()


async def test_a_relative_socket_path_is_resolved(
    kubelet: FakeKubelet, pool: WorkerPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    every_id_form(kubelet)
    monkeypatch.chdir(kubelet.socket_path.parent.parent)
    relative = Path(kubelet.socket_path.parent.name) / kubelet.socket_path.name
    sub = AllocationSubsystem(
        AllocationSettings(
            socket_path=relative,
            call_timeout=1.0,
            process_interval=None,
        ),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
    )
    await sub.poll()
    assert sub.published.up, f"the relative socket {relative} was not reached"
    await sub.stop()


async def test_socket_gone_and_back(kubelet: FakeKubelet, pool: WorkerPool) -> None:
    every_id_form(kubelet)
    clock = FakeClock()
    sub = subsystem(kubelet, pool, clock)
    await sub.poll()
    sub.round_done()
    clock.advance(10)
    sub.round_done()
    before = series(sub.samples())
    train = f'gpu_allocated_seconds_total{{gpu="0",uuid="{UUID_A}",namespace="ml",pod="train"}}'
    assert before[train] == 10

    await kubelet.stop()  # the socket file goes away
    assert not kubelet.socket_path.exists()
    await sub.poll()
    down = series(sub.samples())
    assert down[SOURCE_UP] == 0
    for name in ALLOCATION_SERIES:  # withheld, not reported as zeros
        assert not named(down, name), name
    clock.advance(30)
    sub.round_done()
    assert not named(series(sub.samples()), "gpu_allocated")

    await kubelet.start()
    await sub.poll()  # recovers on the next poll, without waiting out gRPC's reconnect backoff
    clock.advance(5)
    sub.round_done()
    back = series(sub.samples())
    assert back[SOURCE_UP] == 1
    assert named(back, "gpu_allocated") == named(before, "gpu_allocated")
    # The counter resumes where it stopped: the outage is no one's allocated time.
    assert back[train] == 15
    await sub.stop()


async def test_one_connection_serves_poll_after_poll(
    kubelet: FakeKubelet, pool: WorkerPool
) -> None:
    every_id_form(kubelet)
    sub = subsystem(kubelet, pool)
    for _ in range(5):
        await sub.poll()
    assert sub.published.up
    assert kubelet.server is not None
    assert kubelet.server.accepted == 1, "each poll opened a connection of its own"
    await sub.stop()


async def test_a_kubelet_restart_between_polls_is_no_outage(
    kubelet: FakeKubelet, pool: WorkerPool
) -> None:
    # The kept connection dies with the old kubelet; the same poll reconnects to the new one.
    every_id_form(kubelet)
    sub = subsystem(kubelet, pool)
    await sub.poll()
    await kubelet.stop()
    await kubelet.start()
    kubelet.release("train")
    await sub.poll()
    assert sub.published.up, "a restarted kubelet was reported down"
    held = named(series(sub.samples()), "gpu_allocated")
    assert held, "the restarted kubelet's holdings were not published"
    assert not any('pod="train"' in key for key in held), "the old answer stayed"
    await sub.stop()


async def test_a_kubelet_gone_for_good_is_down_on_the_next_poll(
    kubelet: FakeKubelet, pool: WorkerPool
) -> None:
    every_id_form(kubelet)
    sub = subsystem(kubelet, pool)
    await sub.poll()
    await kubelet.stop()
    await sub.poll()
    assert series(sub.samples())[SOURCE_UP] == 0
    await sub.stop()


async def test_never_reachable(short_dir: Path, pool: WorkerPool) -> None:
    # Only the source's state and self-metrics (unresolved ids, folds, flaps): no allocation series.
    unresolved = {
        f'gpu_exporter_allocation_unresolved_total{{reason="{reason}"}}': 0
        for reason in UNRESOLVED_REASONS
    }
    unresolved |= {
        'gpu_exporter_allocation_folded{what="device_ids"}': 0,
        'gpu_exporter_allocation_folded{what="holders"}': 0,
        'gpu_exporter_source_transitions_total{source="pod_resources"}': 0,
    }
    sub = subsystem(FakeKubelet(short_dir / "absent.sock"), pool)
    assert series(sub.samples()) == {SOURCE_UP: 0, **unresolved}
    await sub.poll()
    sub.round_done()
    assert series(sub.samples()) == {SOURCE_UP: 0, **unresolved}
    await sub.stop()


async def test_background_loops_recover(kubelet: FakeKubelet, pool: WorkerPool) -> None:
    every_id_form(kubelet)
    sub = subsystem(kubelet, pool)
    await sub.start()
    await sub.wait_for_poll()
    assert sub.published.up
    await kubelet.stop()
    while sub.published.up:
        await sub.wait_for_poll()
    assert series(sub.samples())[SOURCE_UP] == 0
    await kubelet.start()
    while not sub.published.up:
        await sub.wait_for_poll()
    values = series(sub.samples())
    assert values[SOURCE_UP] == 1
    assert len(named(values, "gpu_allocation_info")) == 6
    await sub.stop()


async def test_release_keeps_counters_for_a_while(kubelet: FakeKubelet, pool: WorkerPool) -> None:
    every_id_form(kubelet)
    clock = FakeClock()
    sub = subsystem(kubelet, pool, clock)
    await sub.poll()
    sub.round_done()
    clock.advance(4)
    sub.round_done()
    kubelet.release("train")
    await sub.poll()
    clock.advance(4)
    sub.round_done()
    values = series(sub.samples())
    train = f'{{gpu="0",uuid="{UUID_A}",namespace="ml",pod="train"}}'
    assert values[f'gpu_allocated{{gpu="0",uuid="{UUID_A}"}}'] == 0
    assert values[f"gpu_allocated_seconds_total{train}"] == 4  # frozen, still published
    assert f"gpu_allocation_idle_streak_seconds{train}" not in values
    clock.advance(301)
    sub.round_done()
    assert f"gpu_allocated_seconds_total{train}" not in series(sub.samples())
    await sub.stop()
