"""A scripted scenario end to end, on a fake clock: the simulator as NVML and as kubelet (real
gRPC), the real activity and utilisation collectors feeding the ledger, and the subsystem.

Idle time must equal the scripted idle time within one sample interval.
"""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pynvml
import pytest

from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.collectors.activity import ActivityCollector
from gpu_exporter.collectors.base import Collector, CollectorContext, SampleWriter
from gpu_exporter.collectors.utilization import UtilizationCollector
from gpu_exporter.config import Config
from gpu_exporter.devices import Device, discover_gpu
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.nvml import DeviceCalls, ErrorCounter, SupportRegistry, WorkerPool
from gpu_exporter.simulator import (
    SimulatedNode,
    install,
    load_scenario,
    loads_scenario,
    uninstall,
)
from gpu_exporter.simulator.kubelet import SimulatedKubelet

from .helpers import FakeClock, named, series

SCENARIO = """
gpus:
  - {model: H100-SXM-80GB, count: 3}
  - {model: H100-SXM-80GB, mig: [3g.40gb, 3g.40gb]}
  - H100-SXM-80GB
workloads:
  - {gpu: 0, pod: trainer, namespace: ml, container: main, pid: 1001, memory: 10GiB, sm: 0.9}
  - gpu: 1
    pod: phases
    namespace: ml
    container: main
    pid: 1002
    sm: {pattern: bursty, value: 0.6, period: 20s, duty: 0.25}   # busy 5 s, idle 15 s
  - gpu: 2
    pod: share-a
    namespace: web
    container: srv
    pid: 1003
    memory: 3GiB
    sm: {pattern: bursty, value: 0.5, period: 40s, duty: 0.5}    # busy 20 s, idle 20 s
  - {gpu: 3, mig: 0, pod: mig-idle, namespace: batch, container: main, pid: 1004, sm: idle}
  - {gpu: 3, mig: 1, pod: mig-busy, namespace: batch, container: main, pid: 1005, sm: 0.5}
allocations:
  - {gpu: 0, pod: trainer, namespace: ml, container: main}
  - {gpu: 1, pod: phases, namespace: ml, container: main}
  - {gpu: 2, replica: 0, pod: share-a, namespace: web, container: srv}
  - {gpu: 2, replica: 1, pod: share-b, namespace: web, container: srv, resource: nvidia.com/gpu}
  - {gpu: 3, mig: 0, pod: mig-idle, namespace: batch, container: main}
  - {gpu: 3, mig: 1, pod: mig-busy, namespace: batch, container: main}
timeline:
  - at: 30s
    type: allocate
    gpu: 4
    pod: notebook
    namespace: research
    container: lab
    workload: {pid: 1006, memory: 1GiB, sm: idle}
  - {at: 70s, type: release, pod: notebook, namespace: research}
"""
SECONDS = 100
SAMPLE_INTERVAL = 1.0


@dataclass
class Rig:
    clock: FakeClock
    node: SimulatedNode
    kubelet: SimulatedKubelet
    subsystem: AllocationSubsystem
    collectors: list[tuple[Collector, DeviceCalls]]

    def sample(self) -> None:
        for collector, calls in self.collectors:
            collector.collect(calls, SampleWriter(collector.device.id.labels))


@pytest.fixture
def node(request: pytest.FixtureRequest) -> Iterator[SimulatedNode]:
    clock = FakeClock()
    text: str | None = getattr(request, "param", SCENARIO)
    scenario = load_scenario(None) if text is None else loads_scenario(textwrap.dedent(text))
    node = SimulatedNode(scenario, clock=clock)
    install(node)
    pynvml.nvmlInit()
    yield node
    pynvml.nvmlShutdown()
    uninstall()
    node.close()


@pytest.fixture
async def rig(node: SimulatedNode, short_dir: Path, pool: WorkerPool) -> AsyncIterator[Rig]:
    clock: FakeClock = node._clock  # type: ignore[assignment]
    support, errors = SupportRegistry(), ErrorCounter()
    devices: list[Device] = [
        d for i in range(len(node.gpus)) for d in discover_gpu(i, support, errors).devices()
    ]
    ledger = ActivityLedger()
    context = CollectorContext(
        Config.fast_interval, Config.slow_interval, clock=clock, ledger=ledger
    )
    collectors: list[tuple[Collector, DeviceCalls]] = [
        (kind(device, context), DeviceCalls(device.uuid, support, errors, collector=kind.name))
        for device in devices
        for kind in (ActivityCollector, UtilizationCollector)
        if kind.applies_to(device)
    ]
    kubelet = SimulatedKubelet(node, short_dir / "kubelet.sock", files_root=short_dir / "host")
    await kubelet.start()
    subsystem = AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket_path,
            proc_path=kubelet.proc_path,
            pod_logs_path=kubelet.pod_logs_path,
        ),
        devices=lambda: devices,
        ledger=ledger,
        executor=pool,
        clock=clock,
        wall_clock=lambda: node.wall_origin + node.now(),  # NVML's sample times, in wall time
    )
    yield Rig(clock, node, kubelet, subsystem, collectors)
    await subsystem.stop()
    await kubelet.stop()


async def run(rig: Rig, seconds: int, *, processes: bool = False) -> None:
    """Each second: an update half way, then a sample, a kubelet poll and another update; with
    ``processes``, a process scan and a per-process activity read before the last update."""
    for _ in range(seconds):
        rig.clock.advance(SAMPLE_INTERVAL / 2)
        rig.subsystem.round_done()
        rig.clock.advance(SAMPLE_INTERVAL / 2)
        rig.sample()
        await rig.subsystem.poll()
        if processes:
            await rig.kubelet.refresh()
            await rig.subsystem.scan_processes()
            await rig.subsystem.sample_activity()
        rig.subsystem.round_done()


def per_pod(values: dict[str, float], name: str) -> dict[str, float]:
    out = {}
    for key, value in named(values, name).items():
        pod = key.split('pod="')[1].split('"')[0]
        out[pod] = value
    return out


async def test_scripted_idle_time(rig: Rig) -> None:
    rig.sample()  # the collectors' first reading is their baseline
    await rig.subsystem.poll()
    rig.subsystem.round_done()
    await run(rig, SECONDS)
    values = series(rig.subsystem.samples())
    idle = per_pod(values, "gpu_allocated_idle_seconds_total")
    allocated = per_pod(values, "gpu_allocated_seconds_total")
    scripted = {
        "trainer": 0,  # the busy training job accrues none
        "phases": 75,  # 15 s of every 20 s
        "share-a": 40,  # the device's idle time, shared by both pods on it
        "share-b": 40,
        "mig-idle": 100,
        "mig-busy": 0,
        "notebook": 40,  # allocated from 30 s to 70 s, idle all along
    }
    assert set(idle) == set(scripted)
    for pod, expected in scripted.items():
        assert idle[pod] == pytest.approx(expected, abs=SAMPLE_INTERVAL), pod
        assert idle[pod] <= allocated[pod]
    assert allocated["trainer"] == pytest.approx(SECONDS, abs=SAMPLE_INTERVAL)
    assert allocated["notebook"] == pytest.approx(40, abs=SAMPLE_INTERVAL)
    streak = per_pod(values, "gpu_allocation_idle_streak_seconds")
    assert streak["mig-idle"] == pytest.approx(SECONDS, abs=SAMPLE_INTERVAL)
    assert streak["trainer"] == 0
    assert "notebook" not in streak  # released: no current streak
    allocated_flags = named(values, "gpu_allocated")
    assert len(allocated_flags) == 6  # 4 whole GPUs and 2 MIG instances (GPU 3 is not one)
    assert sum(allocated_flags.values()) == 5  # the notebook's GPU 4 is free again


async def test_shared_devices_are_idle_per_pod_by_their_own_processes(rig: Rig) -> None:
    rig.sample()
    await rig.subsystem.poll()
    rig.subsystem.round_done()
    await run(rig, SECONDS, processes=True)
    values = series(rig.subsystem.samples())
    idle = per_pod(values, "gpu_allocated_idle_seconds_total")
    # GPU 2, time-sliced: share-a computes 20 s of every 40 s (60 of the 100), share-b runs
    # nothing at all: by the device rule both would accrue the device's 40 s.
    assert idle["share-a"] == pytest.approx(40, abs=2 * SAMPLE_INTERVAL)
    assert idle["share-b"] == pytest.approx(SECONDS, abs=2 * SAMPLE_INTERVAL)
    # Whole GPUs and MIG instances keep the device rule.
    assert idle["trainer"] == 0
    assert idle["phases"] == pytest.approx(75, abs=SAMPLE_INTERVAL)
    assert idle["mig-idle"] == pytest.approx(SECONDS, abs=SAMPLE_INTERVAL)
    active = per_pod(values, "gpu_container_sm_active_seconds_total")
    assert active["share-a"] == pytest.approx(60, abs=2 * SAMPLE_INTERVAL)
    assert "share-b" not in active, "no process, no per-container activity series"
    modes = {k.split('gpu="')[1][0]: k.split('mode="')[1].split('"')[0]
             for k in named(values, "gpu_sharing_info")}  # fmt: skip
    assert modes == {"0": "exclusive", "1": "exclusive", "2": "time_slicing", "3": "mig",
                     "4": "unallocated"}  # fmt: skip


MPS = """
gpus: [{model: H100-SXM-80GB, compute_mode: exclusive_process}]
workloads:
  - {gpu: 0, pod: client-a, namespace: web, container: srv, pid: 2001, sm: 0.5, mps: true}
  - {gpu: 0, pod: client-b, namespace: web, container: srv, pid: 2002, sm: idle, mps: true}
allocations:
  - {gpu: 0, replica: 0, pod: client-a, namespace: web, container: srv,
     resource: nvidia.com/gpu.shared}
  - {gpu: 0, replica: 1, pod: client-b, namespace: web, container: srv,
     resource: nvidia.com/gpu.shared}
"""


@pytest.mark.parametrize("node", [MPS], indirect=True, ids=["mps"])
async def test_an_mps_gpu_and_its_clients(rig: Rig) -> None:
    rig.sample()
    await rig.subsystem.poll()
    rig.subsystem.round_done()
    await run(rig, 20, processes=True)
    values = series(rig.subsystem.samples())
    assert [k.split('mode="')[1].split('"')[0] for k in named(values, "gpu_sharing_info")] == [
        "mps"
    ]
    active = per_pod(values, "gpu_container_sm_active_seconds_total")
    assert active["client-a"] == pytest.approx(20, abs=2 * SAMPLE_INTERVAL)
    assert active["client-b"] == 0
    idle = per_pod(values, "gpu_allocated_idle_seconds_total")
    assert idle["client-b"] == pytest.approx(20, abs=2 * SAMPLE_INTERVAL)
    assert idle["client-a"] == 0
    # The MPS control server is a host process (no pod): its share, 0, is summed under "".
    memory = named(values, "gpu_container_memory_used_bytes")
    assert all('pod="client' in k for k in memory), "the server belongs to no pod"


async def test_memory_and_holders_through_the_simulated_host(rig: Rig) -> None:
    await run(rig, 35)  # the notebook arrives at 30 s
    await rig.kubelet.refresh()
    await rig.subsystem.scan_processes()
    memory = per_pod(series(rig.subsystem.samples()), "gpu_container_memory_used_bytes")
    assert memory == {
        "trainer": 10 * 2**30,
        "phases": 0,  # the scenario gives it no memory: a known 0, not a missing figure
        "share-a": 3 * 2**30,
        "mig-idle": 0,
        "mig-busy": 0,
        "notebook": 2**30,
    }
    share_gpu = rig.node.gpus[2].uuid
    now = rig.subsystem._wall_clock()
    assert rig.subsystem.holders().holder(share_gpu, now, None) is None  # two pods share it
    assert rig.subsystem.holders().holder(share_gpu, now, 1003) == ("web", "share-a")
    assert rig.subsystem.holders().holder(rig.node.gpus[0].uuid, now, None) == ("ml", "trainer")
    mig_gpu = rig.node.gpus[3]
    assert rig.subsystem.holders().holder(mig_gpu.migs[0].uuid, now, None) == ("batch", "mig-idle")


@pytest.mark.parametrize("node", [None], indirect=True, ids=["builtin"])
async def test_builtin_scenario(rig: Rig) -> None:
    rig.sample()
    await rig.subsystem.poll()
    rig.subsystem.round_done()
    await run(rig, 60, processes=True)
    values = series(rig.subsystem.samples())
    idle = per_pod(values, "gpu_allocated_idle_seconds_total")
    allocated = per_pod(values, "gpu_allocated_seconds_total")
    active = per_pod(values, "gpu_container_sm_active_seconds_total")
    # The idle notebook accrues one second of idle time per second; the training job none.
    assert idle["jupyter-alice"] == pytest.approx(60, abs=SAMPLE_INTERVAL)
    assert idle["jupyter-alice"] == pytest.approx(allocated["jupyter-alice"], abs=SAMPLE_INTERVAL)
    assert idle["llama-pretrain-0"] == 0
    assert allocated["llama-pretrain-0"] == pytest.approx(60, abs=SAMPLE_INTERVAL)  # per GPU
    assert idle["jupyter-bob"] == pytest.approx(60, abs=SAMPLE_INTERVAL)  # an idle MIG instance
    assert idle["finetune-small"] == 0
    # The time-sliced inference GPU: the idle pod accrues 1 s/s, the busy one none; the busy
    # pod's own activity grows at its scenario rate (a kernel always resident: 1 s/s; the
    # first read is a baseline, so a second less), the idle pod's stays flat.
    assert idle["llm-serve-b"] == pytest.approx(60, abs=2 * SAMPLE_INTERVAL)
    assert idle["llm-serve-a"] == 0
    assert active["llm-serve-a"] == pytest.approx(60, abs=2 * SAMPLE_INTERVAL)
    assert active["llm-serve-b"] == 0
    modes = {k.split('gpu="')[1][0]: k.split('mode="')[1].split('"')[0]
             for k in named(values, "gpu_sharing_info")}  # fmt: skip
    assert modes == {**dict.fromkeys("01235", "exclusive"), "4": "time_slicing", "6": "mig",
                     "7": "unallocated"}  # fmt: skip
    info = named(values, "gpu_allocation_info")
    assert len(info) == 11
    (observed,) = [k for k in info if 'source="process"' in k]
    assert 'gpu="7"' in observed, "the pod without a request uses GPU 7"
    assert 'pod="debug-shell"' in observed
    gone = named(values, "gpu_unattributed_memory_used_bytes")
    assert list(gone.values()) == [20 * 2**30], "the zombie's memory"
    assert 'class="gone"' in next(iter(gone))
    assert sum(named(values, "gpu_allocated").values()) == 9  # GPUs 0-5, 3 of 4 MIG; GPU 7 free
