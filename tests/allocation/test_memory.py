"""Per-container GPU memory from NVML processes, their cgroups and the pod log directories."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from gpu_exporter.allocation.processes import GpuProcess, NvmlProcessLister
from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.devices import Device
from gpu_exporter.exposition import Sample
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.nvml import WorkerPool
from gpu_exporter.simulator.procfs import cgroup_text, container_id, pod_uid

from .helpers import MIG_1, UUID_A, UUID_B, UUID_C, FakeKubelet, devices, named, series

GIB = 1 << 30


def make_pod(
    root: Path, namespace: str, pod: str, containers: Iterable[str], pids: Mapping[int, str]
) -> None:
    """A pod log directory, and a cgroup file for each pid -> container."""
    uid = pod_uid(namespace, pod)
    for container in containers:
        (root / "pods" / f"{namespace}_{pod}_{uid}" / container).mkdir(parents=True)
    for n, (pid, container) in enumerate(pids.items()):
        cid = container_id(namespace, pod, container)
        (root / "proc" / str(pid)).mkdir(parents=True)
        (root / "proc" / str(pid) / "cgroup").write_text(cgroup_text(uid, cid, pid + n))


class Processes:
    def __init__(self, by_uuid: dict[str, list[GpuProcess]]) -> None:
        self.by_uuid = by_uuid
        self.asked: list[str] = []

    def __call__(self, device: Device) -> list[GpuProcess]:
        self.asked.append(device.uuid)
        if device.uuid == "fail":
            raise RuntimeError("boom")
        return self.by_uuid.get(device.uuid, [])


def make_subsystem(
    kubelet: FakeKubelet, pool: WorkerPool, root: Path, processes: Processes
) -> AllocationSubsystem:
    return AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket_path,
            proc_path=root / "proc",
            pod_logs_path=root / "pods",
        ),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
        process_lister=processes,
    )


def labels(uuid: str, gpu: str, namespace: str, pod: str, container: str) -> str:
    return (
        f'gpu_container_memory_used_bytes{{gpu="{gpu}",uuid="{uuid}",namespace="{namespace}",'
        f'pod="{pod}",container="{container}"}}'
    )


async def test_container_memory(kubelet: FakeKubelet, pool: WorkerPool, tmp_path: Path) -> None:
    kubelet.hold("ml", "train", "trainer", "nvidia.com/gpu", UUID_A)
    kubelet.hold("web", "share-a", "srv", "nvidia.com/gpu", f"{UUID_C}::0")
    kubelet.hold("web", "share-b", "srv", "nvidia.com/gpu", f"{UUID_C}::1")
    kubelet.hold("batch", "mig", "main", "nvidia.com/gpu", MIG_1)
    make_pod(tmp_path, "ml", "train", ["trainer", "sidecar"], {100: "trainer", 101: "trainer"})
    make_pod(tmp_path, "web", "share-a", ["srv"], {200: "srv"})
    make_pod(tmp_path, "web", "share-b", ["srv"], {300: "srv"})
    make_pod(tmp_path, "batch", "mig", ["main"], {400: "main"})
    make_pod(tmp_path, "ops", "unknown-mem", ["x"], {500: "x"})
    (tmp_path / "proc" / "600").mkdir()  # a host process (not in a pod)
    (tmp_path / "proc" / "600" / "cgroup").write_text("0::/system.slice/dcgm.service\n")
    processes = Processes(
        {
            UUID_A: [GpuProcess(100, 60 * GIB), GpuProcess(101, 2 * GIB)],
            UUID_C: [GpuProcess(200, 30 * GIB), GpuProcess(300, 20 * GIB), GpuProcess(600, GIB)],
            MIG_1: [GpuProcess(400, 5 * GIB), GpuProcess(700, GIB)],  # 700: already gone
            UUID_B: [GpuProcess(500, None)],  # not asked: a GPU in MIG mode
        }
    )
    sub = make_subsystem(kubelet, pool, tmp_path, processes)
    await sub.poll()
    sub.round_done()
    await sub.scan_processes()
    assert UUID_B not in processes.asked  # its instances are asked instead
    mig = 'gpu="1",uuid="{}",gpu_instance_id="1",compute_instance_id="0",mig_profile="3g.40gb"'
    assert named(series(sub.samples()), "gpu_container_memory_used_bytes") == {
        labels(UUID_A, "0", "ml", "train", "trainer"): 62 * GIB,
        labels(UUID_C, "2", "web", "share-a", "srv"): 30 * GIB,
        labels(UUID_C, "2", "web", "share-b", "srv"): 20 * GIB,
        "gpu_container_memory_used_bytes{"
        + mig.format(MIG_1)
        + ',namespace="batch",pod="mig",container="main"}': 5 * GIB,
    }
    await sub.stop()


async def test_memory_not_available_is_withheld(
    kubelet: FakeKubelet, pool: WorkerPool, tmp_path: Path
) -> None:
    make_pod(tmp_path, "ml", "train", ["trainer"], {100: "trainer", 101: "trainer"})
    make_pod(tmp_path, "ml", "eval", ["a", "b"], {102: "a"})
    processes = Processes({UUID_A: [GpuProcess(100, None), GpuProcess(102, 3 * GIB)]})
    sub = make_subsystem(kubelet, pool, tmp_path, processes)
    await sub.scan_processes()
    memory = named(series(sub.samples()), "gpu_container_memory_used_bytes")
    # train's only process has no figure: no series. eval has two containers and holds no
    # device the kubelet knows of: the container cannot be told, so it is left empty.
    assert memory == {labels(UUID_A, "0", "ml", "eval", ""): 3 * GIB}
    await sub.stop()


async def test_new_pod_names_are_picked_up(
    kubelet: FakeKubelet, pool: WorkerPool, tmp_path: Path
) -> None:
    (tmp_path / "pods").mkdir()
    processes = Processes({UUID_A: [GpuProcess(100, GIB)]})
    sub = make_subsystem(kubelet, pool, tmp_path, processes)
    await sub.scan_processes()
    assert not named(series(sub.samples()), "gpu_container_memory_used_bytes")
    make_pod(tmp_path, "ml", "train", ["trainer"], {100: "trainer"})
    await sub.scan_processes()
    assert named(series(sub.samples()), "gpu_container_memory_used_bytes") == {
        labels(UUID_A, "0", "ml", "train", "trainer"): GIB
    }
    await sub.stop()


async def test_a_scan_that_finds_the_same_processes_keeps_the_last_scans_objects(
    kubelet: FakeKubelet, pool: WorkerPool, tmp_path: Path
) -> None:
    """A scan's state lives until the next scan: rebuilt equal, it would be moved to the
    garbage collector's old generation at every scan for nothing (and bring on full
    collections, which stall the event loop)."""
    kubelet.hold("ml", "train", "trainer", "nvidia.com/gpu", UUID_A)
    make_pod(tmp_path, "ml", "train", ["trainer"], {100: "trainer", 101: "trainer"})
    processes = Processes({UUID_A: [GpuProcess(100, 2 * GIB), GpuProcess(101, GIB)]})
    sub = make_subsystem(kubelet, pool, tmp_path, processes)
    await sub.poll()
    sub.round_done()
    await sub.scan_processes()
    before, samples = sub.processes, scanned_samples(sub)
    await sub.scan_processes()
    assert all(a is b for a, b in zip(sub.processes, before, strict=True)), "rebuilt equal"
    assert all(a is b for a, b in zip(scanned_samples(sub), samples, strict=True)), "rebuilt"
    processes.by_uuid[UUID_A][1] = GpuProcess(101, 3 * GIB)
    await sub.scan_processes()
    trainer, grown = sub.processes
    assert trainer is before[0], "an unchanged process was rebuilt with its neighbour"
    assert grown.process.used_bytes == 3 * GIB, "a process whose memory grew kept its old figure"
    assert named(series(sub.samples()), "gpu_container_memory_used_bytes") == {
        labels(UUID_A, "0", "ml", "train", "trainer"): 5 * GIB
    }
    await sub.stop()


def scanned_samples(sub: AllocationSubsystem) -> list[Sample]:
    """The series a process scan's findings show (who holds what, memory)."""
    shown = {"gpu_allocation_info", "gpu_allocated", "gpu_container_memory_used_bytes"}
    return [s for s in sub.samples() if s.family.name in shown]


def test_nvml_lister_through_the_simulator() -> None:
    """The default lister reads real pynvml structures (from the simulator's library)."""
    simulator = pytest.importorskip("gpu_exporter.simulator")
    import pynvml

    node = simulator.SimulatedNode(simulator.load_scenario(None))
    simulator.install(node)
    try:
        pynvml.nvmlInit()
        gpu5 = next(g for g in node.gpus if g.index == 5)  # the idle notebook
        handle = pynvml.nvmlDeviceGetHandleByIndex(5)
        device = Device(next(iter(devices())).id, handle)
        listed = NvmlProcessLister()(device)
        assert [(p.pid, p.used_bytes) for p in listed] == [
            (w.pid, w.spec.memory) for w in gpu5.workloads
        ]
        pynvml.nvmlShutdown()
    finally:
        simulator.uninstall()
        node.close()


def test_memory_the_driver_cannot_report_reaches_the_lister_as_none() -> None:
    """NVML_VALUE_NOT_AVAILABLE (2^64-1) in usedGpuMemory: pynvml gives None, and the lister
    keeps it None (the subsystem then withholds the series, as tested above), never 2^64-1."""
    import pynvml

    from gpu_exporter.simulator import SimulatedNode, install, loads_scenario, uninstall

    scenario = """
        gpus: [H100-SXM-80GB]
        workloads:
          - {gpu: 0, pod: a, pid: 300, memory: 2GiB}
          - {gpu: 0, pod: b, pid: 301, memory: 3GiB, memory_reported: false}
    """
    node = SimulatedNode(loads_scenario(textwrap.dedent(scenario), "<test>"))
    install(node)
    try:
        pynvml.nvmlInit()
        device = Device(next(iter(devices())).id, pynvml.nvmlDeviceGetHandleByIndex(0))
        listed = NvmlProcessLister()(device)
        assert [(p.pid, p.used_bytes) for p in listed] == [(300, 2 * GIB), (301, None)]
        pynvml.nvmlShutdown()
    finally:
        uninstall()
        node.close()
