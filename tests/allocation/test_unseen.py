"""GPU use the allocator never sees, on a simulated node in real time: a pod without a request,
a KAI-style reservation pod and the fractional pods on its device, a host process, a zombie."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gpu_exporter.allocation.process_activity import ProcessSample
from gpu_exporter.allocation.processes import GpuProcess
from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.collectors import Cadence
from gpu_exporter.devices import Device
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.nvml import WorkerPool
from gpu_exporter.sampler import Sampler
from gpu_exporter.simulator import SimulatedNode, loads_scenario
from gpu_exporter.simulator.procfs import cgroup_text, container_id, pod_uid

from .helpers import UUID_A, FakeKubelet, devices, named, series
from .live import live_builtin_node
from .test_memory import Processes, make_pod

FAST = 0.25
GIB = 1 << 30
RESERVATION = "kai-resource-reservation/gpu-reservation-1"
SCENARIO = f"""
gpus:
  - {{model: H100-SXM-80GB, count: 4}}
workloads:
  # GPU 0: ml/owner holds it and computes nothing; debug/peek asked for no GPU and keeps it busy.
  - {{gpu: 0, pod: owner, namespace: ml, container: main, pid: 1001, memory: 10GiB, sm: idle}}
  - {{gpu: 0, pod: peek, namespace: debug, container: shell, pid: 1002, memory: 4GiB, sm: 0.9,
     unrequested: true}}
  # GPU 1: KAI's reservation pod holds it; two fractional pods run on it.
  - {{gpu: 1, pod: frac-a, namespace: team-a, container: main, pid: 1102, memory: 20GiB,
     sm: 0.8, reservation: {RESERVATION}}}
  - {{gpu: 1, pod: frac-b, namespace: team-b, container: main, pid: 1103, memory: 10GiB,
     sm: idle, reservation: {RESERVATION}}}
  # GPU 2: a job started over SSH; GPU 3: what a deleted pod left behind.
  - {{gpu: 2, host: true, pid: 1201, process_name: ssh-job, memory: 3GiB, sm: 0.5}}
  - {{gpu: 3, pod: old-job, namespace: batch, container: main, pid: 1301, memory: 30GiB,
     sm: idle, deleted: true}}
allocations:
  - {{gpu: 0, pod: owner, namespace: ml, container: main}}
  - {{gpu: 1, pod: gpu-reservation-1, namespace: kai-resource-reservation, container: reserve}}
"""


@pytest.fixture
async def live() -> AsyncIterator[tuple[Sampler, AllocationSubsystem]]:
    scenario = loads_scenario(SCENARIO, "unseen.yaml")
    async with live_builtin_node(FAST, "test-unseen", scenario) as running:
        subsystem = running[1]
        # A scan after the kubelet answered: until then no pod is said to hold nothing.
        while len({p.process.pid for p in subsystem.processes if p.process_class != "held"}) < 5:
            await subsystem.wait_for_poll()
        yield running


def one(values: dict[str, float], name: str, *parts: str) -> float:
    found = [v for k, v in named(values, name).items() if all(p in k for p in parts)]
    assert len(found) == 1, f"one {name} series with {parts}, got {found}"
    return found[0]


async def test_every_gpu_process_is_classed_by_who_holds_its_device(
    live: tuple[Sampler, AllocationSubsystem],
) -> None:
    _, subsystem = live
    classes = {p.process.pid: p.process_class for p in subsystem.processes}
    assert classes == {
        1001: "held",
        1002: "not_held",
        1102: "not_held",
        1103: "not_held",
        1201: "no_pod",
        1301: "gone",
    }
    commands = {p.process.pid: p.process.command for p in subsystem.processes}
    assert commands[1201] == "ssh-job", "the command name of what holds nothing is read"
    assert commands[1301] == "python"


async def test_pods_running_on_a_device_they_do_not_hold_are_process_holders(
    live: tuple[Sampler, AllocationSubsystem],
) -> None:
    _, subsystem = live
    await subsystem.wait_for_poll()
    info = named(series(subsystem.samples()), "gpu_allocation_info")
    sources = {
        (k.split('gpu="')[1][0], k.split('pod="')[1].split('"')[0], k.split(',source="')[1][:-2])
        for k in info
    }
    assert sources == {
        ("0", "owner", "pod-resources"),
        ("0", "peek", "process"),
        ("1", "gpu-reservation-1", "pod-resources"),
        ("1", "frac-a", "process"),
        ("1", "frac-b", "process"),
    }
    values = series(subsystem.samples())
    memory = {
        k.split('pod="')[1].split('"')[0]: v
        for k, v in named(values, "gpu_container_memory_used_bytes").items()
    }
    assert memory == {"owner": 10 * GIB, "peek": 4 * GIB, "frac-a": 20 * GIB, "frac-b": 10 * GIB}, (
        "each pod its own processes' memory: the holder is not charged for the unrequested "
        "pod's, the reservation pod (no process) for its fractional pods'"
    )
    unattributed = "gpu_unattributed_memory_used_bytes"
    assert named(values, unattributed) == {
        f"{unattributed}{{{key}}}": value
        for key, value in (
            (one_labels(values, "2") + ',class="no_pod"', 3.0 * GIB),
            (one_labels(values, "3") + ',class="gone"', 30.0 * GIB),
        )
    }, "memory of no pod and of a gone pod, per device and class, without PIDs"


def one_labels(values: dict[str, float], gpu: str) -> str:
    """A device's own labels, as gpu_allocated... names them (gpu, uuid)."""
    key = next(
        k for k in named(values, "gpu_unattributed_sm_active_seconds_total") if f'gpu="{gpu}"' in k
    )
    return key.split("{")[1].split(",class=")[0]


async def test_another_pods_kernels_are_not_the_holders_activity(
    live: tuple[Sampler, AllocationSubsystem],
) -> None:
    sampler, subsystem = live
    # Per-process samples come once a second; the first read is a baseline.
    await sampler.wait_for_rounds(Cadence.FAST, int(2.5 / FAST))
    first, started = series(subsystem.samples()), time.monotonic()
    await sampler.wait_for_rounds(Cadence.FAST, int(4 / FAST))
    last, elapsed = series(subsystem.samples()), time.monotonic() - started

    def gained(name: str, *parts: str) -> float:
        return one(last, name, *parts) - one(first, name, *parts)

    idle, active = "gpu_allocated_idle_seconds_total", "gpu_container_sm_active_seconds_total"
    assert gained(idle, 'pod="owner"') == pytest.approx(elapsed, abs=1.6), (
        "the holder stays idle while a pod without a request keeps its GPU busy"
    )
    assert gained(active, 'pod="owner"') <= 0.5, "nor is it charged for the other pod's kernels"
    assert gained(active, 'pod="peek"') == pytest.approx(elapsed, abs=1.6)
    assert gained(idle, 'pod="peek"') <= 0.5, "the busy unrequested pod is not idle"
    assert gained(active, 'pod="frac-a"') == pytest.approx(elapsed, abs=1.6)
    assert gained(idle, 'pod="frac-b"') == pytest.approx(elapsed, abs=1.6)
    assert gained(idle, 'pod="gpu-reservation-1"') == pytest.approx(elapsed, abs=1.6), (
        "the reservation pod runs nothing: its fractional pods' kernels are theirs"
    )
    unattributed = "gpu_unattributed_sm_active_seconds_total"
    assert gained(unattributed, 'gpu="2"', 'class="no_pod"') == pytest.approx(elapsed, abs=1.6)
    assert gained(unattributed, 'gpu="3"', 'class="gone"') == 0, "the zombie computes nothing"
    assert len(named(last, unattributed)) == 8, "two classes on each of the four GPUs"


async def test_series_stay_bounded_while_a_thousand_processes_come_and_go(
    kubelet: FakeKubelet, pool: WorkerPool, tmp_path: Path
) -> None:
    """Host processes, zombies of ever new pods and a debugging pod's ever new processes: the
    series name devices, classes and pods, never a PID or a pod UID."""
    kubelet.hold("ml", "train", "trainer", "nvidia.com/gpu", UUID_A)
    kubelet.running.append(("debug", "shell", "sh"))
    make_pod(tmp_path, "debug", "shell", ["sh"], {})
    current: list[GpuProcess] = []
    stamp = [0]

    def utilization(device: Device) -> list[ProcessSample]:
        stamp[0] += 1_000_000
        on_a = current if device.uuid == UUID_A else []
        return [ProcessSample(p.pid, stamp[0], 0.5, 0.1) for p in on_a]

    sub = AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket_path,
            proc_path=tmp_path / "proc",
            pod_logs_path=tmp_path / "pods",
        ),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
        process_lister=Processes({UUID_A: current}),
        utilization_reader=utilization,
    )
    await sub.poll()
    seen: set[str] = set()
    pids = iter(range(10_000, 11_000))
    for _ in range(10):
        current.clear()
        for kind in range(100):
            pid = next(pids)
            current.append(GpuProcess(pid, GIB))
            if kind % 3 == 1:  # a zombie: a pod UID no log directory names
                write_cgroup(tmp_path, pid, str(uuid.uuid4()))
            elif kind % 3 == 2:
                write_cgroup(tmp_path, pid, pod_uid("debug", "shell"))
        await sub.scan_processes()
        await sub.sample_activity()
        sub.round_done()
        seen |= set(series(sub.samples()))
    assert len({p.process.pid for p in sub.processes}) == 100, "the last scan's processes"
    assert not [k for k in seen if any(str(pid) in k for pid in range(10_000, 11_000))]
    mine = {
        k
        for k in seen
        if k.startswith(("gpu_unattributed_", "gpu_allocation_info", "gpu_container_"))
    }
    per_device = len([d for d in devices() if not d.id.is_mig and d.id.mig_mode != "enabled"])
    assert len(mine) == (
        2  # allocation_info: the holder, the debugging pod by its processes
        + 4  # the debugging pod's memory and activity (ratio, seconds, bandwidth)
        + 2  # unattributed memory: no_pod and gone on the one device
        + 2 * per_device  # unattributed SM seconds: two classes on each sampled device
    ), "\n".join(sorted(mine))
    await sub.stop()


BOUNDED_SCENARIO = """
gpus: [{model: H100-SXM-80GB, count: 2}]
workloads:
  - {gpu: 0, pod: owner, namespace: ml, container: main, pid: 1001, memory: 10GiB, sm: 0.2}
allocations:
  - {gpu: 0, pod: owner, namespace: ml, container: main}
"""


def batch_of_processes(pids: range) -> tuple[list[dict[str, object]], dict[int, str]]:
    """Start events for one batch on GPU 0, a third each: jobs over SSH, zombies of ever new
    deleted pods, a debugging pod's ever new processes; and the class each must get."""
    events: list[dict[str, object]] = []
    expected: dict[int, str] = {}
    for pid in pids:
        event: dict[str, object] = {"type": "workload_start", "gpu": 0, "pid": pid}
        event |= {"memory": "32MiB", "sm": 0.001}
        kind = pid % 3
        if kind == 0:
            event["host"], expected[pid] = True, "no_pod"
        elif kind == 1:
            event |= {"pod": f"job-{pid}", "namespace": "batch", "deleted": True}
            expected[pid] = "gone"
        else:
            event |= {"pod": "shell", "namespace": "debug", "unrequested": True}
            expected[pid] = "not_held"
        events.append(event)
    return events, expected


MINE = ("gpu_unattributed_", "gpu_allocation_info", "gpu_container_", "gpu_allocated_")


async def test_series_stay_bounded_on_the_simulator_while_a_thousand_processes_come_and_go() -> (
    None
):
    """The same on the simulated node, through its NVML process lists, /proc cgroups and kubelet:
    four batches of 250 distinct processes start and exit by simulator events. Read at every
    poll, the series over all 1,000 are one batch's, plus at most the bucket per device for
    processes the last scan has not mapped yet; once they exit, their memory and the holder they
    made leave."""
    node = SimulatedNode(loads_scenario(BOUNDED_SCENARIO, "bounded.yaml"))
    seen: set[str] = set()

    async def poll_until(done: Callable[[dict[int, str], set[str]], bool], what: str) -> None:
        for _ in range(200):  # polls, a quarter of a second each
            await subsystem.wait_for_poll()
            subsystem.round_done()
            current = {k for k in series(subsystem.samples()) if k.startswith(MINE)}
            seen.update(current)
            classes = {p.process.pid: p.process_class for p in subsystem.processes}
            if done(classes, current):
                return
        pytest.fail(f"{what}: the last scan's classes {classes}")

    def classed(expected: dict[int, str]) -> Callable[[dict[int, str], set[str]], bool]:
        """Every process of the batch classed, and the debugging pod's activity read."""
        active = "gpu_container_sm_active_seconds_total"
        return lambda classes, current: (
            all(classes.get(pid) == want for pid, want in expected.items())
            and any(k.startswith(active) and 'pod="shell"' in k for k in current)
        )

    async with live_builtin_node(FAST, "test-unseen-bounded", node=node) as (_, subsystem):
        first_batch: set[str] = set()
        for first in range(20_000, 21_000, 250):
            events, expected = batch_of_processes(range(first, first + 250))
            await asyncio.to_thread(node.inject_many, events, "<test>")
            await poll_until(classed(expected), f"the batch from pid {first} classed")
            first_batch = first_batch or set(seen)
            stops = [{"type": "workload_stop", "pid": pid} for pid in expected]
            await asyncio.to_thread(node.inject_many, stops, "<test>")
        await poll_until(lambda classes, _: set(classes) == {1001}, "every batch gone")
        after = {k for k in series(subsystem.samples()) if k.startswith(MINE)}
    unmapped = {k for k in seen if k.startswith("gpu_container_") and 'pod="",container=""' in k}
    assert seen - unmapped == first_batch - unmapped, "a batch of new processes added series"
    assert len(unmapped) <= 3 * 2, "three series per device for processes not mapped yet"
    pids = range(20_000, 21_000)
    assert not [k for k in seen if "job-" in k or any(f"{pid}" in k for pid in pids)], (
        "a PID or a deleted pod's name became a label"
    )
    assert {k.split('pod="')[1].split('"')[0] for k in seen if 'pod="' in k} <= {
        "owner",
        "shell",
        "",
    }
    # (its counters stay for a retention window, as any released holder's and container's do)
    holder = ("gpu_allocation_info", "gpu_container_memory_used_bytes")
    left = [k for k in after if 'pod="shell"' in k and k.startswith(holder)]
    assert not left, "the pod without a request is no holder once its processes exit"
    assert not named(dict.fromkeys(after, 0.0), "gpu_unattributed_memory_used_bytes"), (
        "no memory is held by what is gone"
    )


def write_cgroup(root: Path, pid: int, uid: str) -> None:
    (root / "proc" / str(pid)).mkdir(parents=True)
    cid = container_id("any", "pod", str(pid))
    (root / "proc" / str(pid) / "cgroup").write_text(cgroup_text(uid, cid, pid))


async def test_no_pod_is_said_to_hold_nothing_before_the_kubelet_answers(
    kubelet: FakeKubelet, pool: WorkerPool, tmp_path: Path
) -> None:
    kubelet.running.append(("debug", "shell", "sh"))
    make_pod(tmp_path, "debug", "shell", ["sh"], {100: "sh"})
    sub = AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket_path,
            proc_path=tmp_path / "proc",
            pod_logs_path=tmp_path / "pods",
        ),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
        process_lister=Processes({UUID_A: [GpuProcess(100, GIB)]}),
    )
    await sub.scan_processes()
    assert [p.process_class for p in sub.processes] == ["held"], "unknown: not flagged"
    await sub.poll()
    await sub.scan_processes()
    assert [p.process_class for p in sub.processes] == ["not_held"], "the kubelet's word"
    info = named(series(sub.samples()), "gpu_allocation_info")
    assert [k for k in info if 'source="process"' in k and 'pod="shell"' in k]
    await sub.stop()
