"""What a kubelet's List answer may turn into, and what a flapping kubelet may write to the log
(issue 37: 100,000 pods took 714 MB and 401,000 series; a flap a second wrote 2.6 GB a day)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from structlog.testing import capture_logs

from gpu_exporter.allocation import podresources
from gpu_exporter.allocation.holder_sources import REASON_CHARS, cut_reason
from gpu_exporter.allocation.podresources import (
    MAX_HOLDERS_PER_DEVICE,
    MAX_IDS_PER_CONTAINER,
    ContainerDevices,
    PodResourcesClient,
)
from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.nvml import WorkerPool
from gpu_exporter.simulator.podresources_server import KubeletState

from .helpers import UUID_A, UUID_C, FakeClock, FakeKubelet, devices, named, series

PODS = 30_000
HOLDING = 10_000  # of them hold a replica of A or C; the rest hold only a NIC


def subsystem(kubelet: FakeKubelet, pool: WorkerPool) -> AllocationSubsystem:
    return AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket_path,
            call_timeout=10.0,
            process_interval=None,
            proc_path=Path("/nonexistent"),
            pod_logs_path=Path("/nonexistent"),
        ),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
        clock=FakeClock(),
    )


def crowd(kubelet: FakeKubelet) -> None:
    for i in range(PODS):
        if i < HOLDING:
            device = (UUID_A, UUID_C)[i % 2]
            kubelet.hold(f"ns-{i % 13}", f"pod-{i:05d}", "main", "nvidia.com/gpu", f"{device}::{i}")
        else:
            kubelet.hold(f"ns-{i % 13}", f"pod-{i:05d}", "main", "example.com/nic", f"nic{i}")


def decoded_on(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    """The threads the List answers are decoded on (read_holdings, wrapped)."""
    threads: list[threading.Thread] = []
    original = podresources.read_holdings

    def recording(data: bytes) -> podresources._Holdings:
        threads.append(threading.current_thread())
        return original(data)

    monkeypatch.setattr(podresources, "read_holdings", recording)
    return threads


async def test_thirty_thousand_pods_become_a_bounded_set_of_holders_off_the_loop(
    kubelet: FakeKubelet, pool: WorkerPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    crowd(kubelet)
    threads = decoded_on(monkeypatch)
    client = PodResourcesClient(kubelet.socket_path, timeout=10.0)
    snapshot = await client.fetch()
    await client.close()
    assert threads, "the answer was not decoded"
    assert threading.main_thread() not in threads, "decoded on the event loop"
    assert all(c.resource == "nvidia.com/gpu" for c in snapshot.containers), (
        "pods that hold no NVIDIA device became objects"
    )
    assert len(snapshot.containers) == 2 * MAX_HOLDERS_PER_DEVICE
    assert snapshot.folded.holders == HOLDING - 2 * MAX_HOLDERS_PER_DEVICE
    kept = sorted((c.namespace, c.pod) for c in snapshot.containers if UUID_A in c.device_ids[0])
    everyone = sorted((f"ns-{i % 13}", f"pod-{i:05d}") for i in range(0, HOLDING, 2))
    assert kept == everyone[:MAX_HOLDERS_PER_DEVICE], "not the first holders by namespace and pod"

    sub = subsystem(kubelet, pool)
    await sub.poll()
    values = series(sub.samples())
    await sub.stop()
    assert len(named(values, "gpu_allocation_info")) == 2 * MAX_HOLDERS_PER_DEVICE
    assert len(named(values, "gpu_allocated_seconds_total")) == 2 * MAX_HOLDERS_PER_DEVICE
    assert len(values) < 1000, "the series grew with the pods"
    folded = 'gpu_exporter_allocation_folded{what="holders"}'
    assert values[folded] == HOLDING - 2 * MAX_HOLDERS_PER_DEVICE


async def test_a_container_with_300000_device_ids_keeps_a_bounded_number(
    kubelet: FakeKubelet, pool: WorkerPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [f"{UUID_A}::{n}" for n in range(300_000)]
    kubelet.hold("ml", "greedy", "main", "nvidia.com/gpu", *ids)
    kubelet.hold("ml", "train", "main", "nvidia.com/gpu", UUID_C)
    threads = decoded_on(monkeypatch)
    sub = subsystem(kubelet, pool)
    await sub.poll()
    values = series(sub.samples())
    await sub.stop()
    assert threads, "the answer was not decoded"
    assert threading.main_thread() not in threads, "decoded on the event loop"
    assert len(named(values, "gpu_allocation_info")) == 2  # greedy on A, train on C
    assert values['gpu_exporter_allocation_folded{what="device_ids"}'] == (
        300_000 - MAX_IDS_PER_CONTAINER
    )
    assert values['gpu_exporter_allocation_folded{what="holders"}'] == 0


def test_ids_a_plugin_writes_are_kept_before_invented_ones() -> None:
    """An answer past the bound of distinct devices keeps the real devices' holders."""
    invented = [("x", f"p{i}", "c", "nvidia.com/gpu", (f"000-{i}",)) for i in range(500)]
    real = ("ml", "train", "c", "nvidia.com/gpu", (UUID_A,))
    containers, _, folded = podresources._bounded([*invented, real], [], 0)
    assert ContainerDevices(*real) in containers
    assert folded.holders == 500 - (podresources.MAX_DEVICES - 1)


class FlappingKubelet:
    """Answers, or refuses every call with a long grpc-message while ``down``."""

    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet
        self.down = False
        kubelet.hold("ml", "train", "main", "nvidia.com/gpu", UUID_A)

    def state(self) -> KubeletState:
        if self.down:
            raise GRPCError(Status.UNAVAILABLE, "kubelet restarting \x1b[31m" + "x" * 20_000)
        return FakeKubelet.state(self.kubelet)


async def test_a_kubelet_that_flaps_100_times_writes_a_bounded_log_and_counts_the_flaps(
    short_dir: Path, pool: WorkerPool
) -> None:
    kubelet = FakeKubelet(short_dir / "flapping.sock")
    flapping = FlappingKubelet(kubelet)
    kubelet.state = flapping.state  # type: ignore[method-assign]
    await kubelet.start()
    sub = subsystem(kubelet, pool)
    try:
        with capture_logs() as logs:
            for _ in range(100):
                await sub.poll()
                flapping.down = True
                await sub.poll()
                flapping.down = False
        values = series(sub.samples())
    finally:
        await sub.stop()
        await kubelet.stop()
    written = sum(len(json.dumps(entry, default=str)) for entry in logs)
    assert written < 2000, logs
    assert any("down" in entry["event"] for entry in logs), "the first fall was not said"
    assert values['gpu_exporter_source_transitions_total{source="pod_resources"}'] == 200
    assert all("\x1b" not in str(entry.get("error", "")) for entry in logs), "raw escape logged"


def test_a_failure_is_escaped_and_cut() -> None:
    said = cut_reason("UNAVAILABLE: \x1b[2J\u00e9" + "y" * 1000)
    assert said.startswith("UNAVAILABLE: \\x1b[2J\\xe9y")
    assert said.endswith("(824 more)")
    assert len(said) < REASON_CHARS + 20
    assert cut_reason("short") == "short"


def test_the_drivers_kept_are_the_ones_resolved() -> None:
    from gpu_exporter.allocation.dra import COMPUTE_DOMAIN_DRIVER, GPU_DRIVER

    assert {GPU_DRIVER, COMPUTE_DOMAIN_DRIVER} == podresources._OUR_DRIVERS
