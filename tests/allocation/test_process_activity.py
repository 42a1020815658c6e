"""Per-process samples summed per container: every sample counted once, totals add up."""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Iterator

import pynvml
import pytest

from gpu_exporter.allocation.process_activity import (
    UNKNOWN,
    ContainerActivity,
    Owner,
    ProcessSample,
    ProcessUtilizationReader,
)
from gpu_exporter.devices import Device, DeviceId
from gpu_exporter.simulator import SimulatedNode, install, loads_scenario, uninstall
from gpu_exporter.simulator.patterns import integrate
from tests.helpers import ManualClock

SHARED = """
gpus: [H100-SXM-80GB, {model: H100-SXM-80GB, mig: [3g.40gb]}]
workloads:
  - {gpu: 0, pod: busy, pid: 100, dram: 0.5,
     sm: {pattern: bursty, value: 0.8, low: 0.1, period: 7s, duty: 0.5}}
  - {gpu: 0, pod: bursty, pid: 101, dram: 0.3,
     sm: {pattern: bursty, value: 0.6, period: 13s, duty: 0.3}}
  - {gpu: 0, pod: idle, pid: 102, sm: idle}
  - {gpu: 0, pod: stranger, pid: 103, sm: {pattern: bursty, value: 0.2, period: 5s, duty: 0.2}}
  - {gpu: 1, mig: 0, pod: small, pid: 200, sm: 0.5}
"""
OWNERS: dict[int, Owner] = {
    100: ("ml", "busy", "main"),
    101: ("ml", "bursty", "main"),
    102: ("ml", "idle", "main"),
}  # 103 belongs to no known container


@pytest.fixture
def node() -> Iterator[tuple[SimulatedNode, ManualClock]]:
    clock = ManualClock(1000.0)
    node = SimulatedNode(
        loads_scenario(textwrap.dedent(SHARED), "shared.yaml"), clock=clock, wall_origin=1.8e9
    )
    install(node)
    pynvml.nvmlInit()
    yield node, clock
    uninstall()
    node.close()


def device(index: int) -> Device:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    return Device(DeviceId(index, uuid), handle)


def run(
    node: SimulatedNode,
    clock: ManualClock,
    steps: list[float],
    state: tuple[ProcessUtilizationReader, ContainerActivity] | None = None,
) -> tuple[ContainerActivity, list[ProcessSample]]:
    """Read and integrate after each step of simulated time; returns every sample read."""
    gpu0 = device(0)
    reader, activity = state or (ProcessUtilizationReader(), ContainerActivity())
    read: list[ProcessSample] = []
    for step in steps:
        clock.advance(step)
        samples = reader(gpu0)
        assert samples is not None
        read.extend(samples)
        activity.add(gpu0.id, samples, OWNERS.get, now=clock(), wall_now=1.8e9 + node.now())
    return activity, read


def util_between(node: SimulatedNode, a: float, b: float) -> float:
    """The device's utilisation integral over [a, b] (what gpu_utilization_seconds_total gains)."""
    return integrate(node.gpus[0].signals("util"), a, b).integral


def test_container_integrals_add_up_to_the_device_utilization_integral(
    node: tuple[SimulatedNode, ManualClock],
) -> None:
    simulated, clock = node
    irregular = [1.0, 0.7, 2.3, 0.4, 1.6, 3.0] * 7  # about a minute, reads never on the beat
    activity, _ = run(simulated, clock, [1.5, *irregular])
    total = sum(a.sm_seconds for a in activity.owners())
    # The first read (at 1.5 s: the sample of second 1) is the baseline; samples of seconds
    # 2..now were counted, each covering the second before it.
    expected = util_between(simulated, 1.0, int(simulated.now()))
    assert expected > 30
    assert total == pytest.approx(expected, rel=0.05), "containers' sum vs the device's integral"
    by_owner = {a.owner: a.sm_seconds for a in activity.owners()}
    assert by_owner[UNKNOWN] > 0, "a process of no known container is summed under container=''"
    assert by_owner[("ml", "idle", "main")] == 0


def test_every_sample_is_read_once_whatever_the_read_cadence(
    node: tuple[SimulatedNode, ManualClock],
) -> None:
    simulated, clock = node
    _, read = run(simulated, clock, [0.3, 0.2, 0.9, 2.5, 0.1, 0.1, 4.0, 1.9])
    keys = [(s.pid, s.timestamp_us) for s in read]
    assert len(keys) == len(set(keys)), "a sample was read twice"
    per_pid = {pid: sorted(t for p, t in keys if p == pid) for pid in (100, 101, 102, 103)}
    seconds = int(simulated.now())
    for pid, stamps in per_pid.items():
        assert len(stamps) == seconds, f"pid {pid}: one sample per second, none dropped"
        assert all(b - a == 1_000_000 for a, b in itertools.pairwise(stamps))


def test_the_first_read_is_a_baseline(node: tuple[SimulatedNode, ManualClock]) -> None:
    simulated, clock = node
    clock.advance(20)  # the driver holds 20 s of history before the exporter's first read
    state = (ProcessUtilizationReader(), ContainerActivity())
    activity, read = run(simulated, clock, [0.0], state)
    assert len(read) == 20 * 4
    assert list(activity.owners()) == [], "history from before the start is not counted"
    run(simulated, clock, [2.0], state)
    busy = next(a for a in activity.owners() if a.owner[1] == "busy")
    assert 0 < busy.sm_seconds <= 2.0, "only the two seconds since the baseline"


def test_ratios_are_the_last_windows_mean(node: tuple[SimulatedNode, ManualClock]) -> None:
    simulated, clock = node
    activity, _ = run(simulated, clock, [1.0, 3.0])
    ratios = {a.owner[1]: (a.sm_ratio, a.memory_ratio) for a in activity.owners()}
    assert ratios["idle"] == (0.0, 0.0)
    assert ratios["busy"][0] > 0.4, "a kernel always resident, sharing the device's time"
    assert sum(sm for sm, _ in ratios.values()) <= 1.0, "time slices add up to one device"
    assert 0 < ratios["busy"][1] <= 0.5


def test_mig_enabled_gpus_have_no_per_process_signal(
    node: tuple[SimulatedNode, ManualClock],
) -> None:
    reader = ProcessUtilizationReader()
    assert reader(device(1)) is None, "NotSupported on MIG-enabled GPUs, for either call"


def test_falls_back_to_the_older_call(node: tuple[SimulatedNode, ManualClock]) -> None:
    simulated, clock = node
    simulated.inject(
        {"type": "nvml_error", "function": "nvmlDeviceGetProcessesUtilizationInfo",
         "error": "not_supported"}
    )  # fmt: skip
    clock.advance(3)
    samples = ProcessUtilizationReader()(device(0))
    assert samples is not None
    assert len(samples) == 3 * 4
    assert simulated.calls["nvmlDeviceGetProcessUtilization"] > 0, "the older call answered"
