"""Placement per holder, end to end on the simulator: its kubelet (real gRPC, with the static CPU
and memory managers' assignments), its NVML topology read once per allocation change, and the
sampler's rounds driving the per-holder activity bands (demo/scenarios/placement.yaml, the
built-in HGX node)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.allocation.model import Allocations, Holding
from gpu_exporter.allocation.placement import PlacementReader, PlacementSnapshot, PodPath, place
from gpu_exporter.allocation.podresources import ContainerCpus
from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.devices import Device, DeviceId
from gpu_exporter.simulator.kubelet import SimulatedKubelet
from gpu_exporter.topology.paths import PathKind, Topology, pair
from tests.dcgm.helpers import DcgmRig, dcgm_rig
from tests.helpers import Series, one, select

SCENARIOS = Path(__file__).resolve().parents[2] / "demo" / "scenarios"
PLACEMENT = (SCENARIOS / "placement.yaml").read_text()
BUILTIN = resources.files("gpu_exporter.simulator").joinpath("data/builtin.yaml").read_text()


class CountingReader:
    """The real placement read, counted: the topology must be read once per change."""

    def __init__(self) -> None:
        self.reads = 0
        self._reader = PlacementReader(None)

    def __call__(
        self, devices: Sequence[Device], allocations: Allocations, cpus: Sequence[ContainerCpus]
    ) -> PlacementSnapshot:
        self.reads += 1
        return self._reader(devices, allocations, cpus)


@dataclass
class PlacementRig:
    rig: DcgmRig
    kubelet: SimulatedKubelet
    subsystem: AllocationSubsystem
    reader: CountingReader

    async def step(self) -> Series:
        await self.subsystem.poll()
        return await self.rig.step()


@asynccontextmanager
async def placement_rig(scenario: str, *flags: str, **config: Any) -> AsyncIterator[PlacementRig]:
    async with dcgm_rig(scenario, *flags, **config) as rig:
        kubelet = SimulatedKubelet(rig.sim.node)
        await kubelet.start()
        reader = CountingReader()
        subsystem = AllocationSubsystem(
            AllocationSettings(
                socket_path=kubelet.socket_path,
                process_interval=None,
            ),
            devices=rig.sim.sampler.devices,
            ledger=rig.sim.shared.ledger,
            executor=rig.sim.sampler_pool,
            clock=rig.sim.clock,
            placement_reader=reader,
        )
        rig.sim.sampler.add_source(subsystem)
        rig.sim.sampler.add_round_listener(subsystem)
        try:
            yield PlacementRig(rig, kubelet, subsystem, reader)
        finally:
            await subsystem.stop()
            await kubelet.close()


def paths(series: Series) -> dict[str, tuple[str, str]]:
    return {
        dict(key)["pod"]: (dict(key)["path"], dict(key)["best_path"])
        for key in select(series, "gpu_allocation_path_info")
    }


def aligned(series: Series, name: str) -> dict[tuple[str, str], float]:
    return {
        (dict(key)["pod"], dict(key)["gpu"]): value for key, value in select(series, name).items()
    }


async def test_each_placement_case_yields_its_path_and_numa_alignment() -> None:
    async with placement_rig(PLACEMENT) as placed:
        series = await placed.step()
        assert paths(series) == {"tp-split": ("system", "pcie_switch")}, (
            "only the two-GPU pod has a path: across the sockets, where one switch was free"
        )
        cpus = aligned(series, "gpu_allocation_numa_aligned_ratio")
        assert cpus[("loader-far", "1")] == 0.0, "its CPUs are all on the other socket"
        assert cpus[("starved", "2")] == cpus[("steady", "3")] == 1.0
        # tp-split's one container holds a GPU on each socket: its CPUs can be near one only.
        assert (cpus[("tp-split", "0")], cpus[("tp-split", "5")]) == (1.0, 0.0)
        memory = aligned(series, "gpu_allocation_memory_numa_aligned_ratio")
        assert memory[("loader-far", "1")] == 0.0
        assert memory[("starved", "2")] == 1.0


async def test_the_topology_is_read_once_per_allocation_change_not_per_round() -> None:
    async with placement_rig(PLACEMENT) as placed:
        for _ in range(5):
            await placed.step()
        assert placed.reader.reads == 1, "five polls of one allocation: one read"
        placed.rig.inject(
            {"type": "allocate", "gpu": 6, "pod": "late", "namespace": "ml", "container": "c"}
        )
        placed.rig.inject(
            {"type": "allocate", "gpu": 7, "pod": "late", "namespace": "ml", "container": "c"}
        )
        series = await placed.step()
        await placed.step()
        assert placed.reader.reads == 2, "one more read for the change"
        assert paths(series)["late"] == ("pcie_switch", "pcie_switch"), "one switch: as good as any"


async def test_a_container_without_cpu_ids_has_no_alignment_not_zero() -> None:
    async with placement_rig(BUILTIN) as placed:
        series = await placed.step()
        assert paths(series)["llama-pretrain-0"] == ("nvlink", "nvlink"), "the HGX board: quiet"
        assert not select(series, "gpu_allocation_numa_aligned_ratio"), "no CPU manager: absent"


async def test_starved_and_steady_holders_of_one_mean_land_in_different_bands() -> None:
    # The GPU's own bands (compared with the holder's below) come with the activity detail.
    async with placement_rig(PLACEMENT, "--collector.activity.detail") as placed:
        for _ in range(4):
            start = await placed.step()
        for _ in range(40):
            end = await placed.step()

    def share(pod: str, band: str) -> float:
        name = "gpu_allocation_sm_activity_band_seconds_total"
        return (one(end, name, pod=pod, band=band) - one(start, name, pod=pod, band=band)) / 40

    def mean(gpu: str) -> float:
        name = "gpu_sm_active_seconds_total"
        return (one(end, name, gpu=gpu) - one(start, name, gpu=gpu)) / 40

    assert mean("2") == pytest.approx(mean("3"), rel=0.1), "the same mean"
    assert share("starved", "high") >= 0.4
    assert share("starved", "low") >= 0.4
    assert share("starved", "mid") <= 0.1
    assert share("steady", "mid") >= 0.95
    per_gpu = "gpu_sm_activity_band_seconds_total"
    for band in ("low", "mid", "high"):
        gpu_seconds = one(end, per_gpu, gpu="2", band=band)
        gpu_seconds -= one(start, per_gpu, gpu="2", band=band)
        assert share("starved", band) == pytest.approx(gpu_seconds / 40, abs=0.03), (
            f"the sole holder's {band} band follows its GPU's"
        )


def holding(device: DeviceId, pod: str, container: str = "main") -> Holding:
    return Holding(device, "ml", pod, container, "nvidia.com/gpu")


def test_a_mig_instance_counts_as_its_gpu_and_a_mig_mode_gpu_is_never_free() -> None:
    a, b, c = (DeviceId(i, f"GPU-{n}") for i, n in enumerate("abc"))
    mig_gpu = DeviceId(3, "GPU-m", mig_mode="enabled")
    instance = DeviceId(3, "MIG-m1", parent_uuid="GPU-m", gpu_instance_id=1)
    nvlink = {pair("GPU-a", "GPU-m"), pair("GPU-b", "GPU-m"), pair("GPU-a", "GPU-b")}
    topology = Topology(
        {
            pair(x, y): PathKind.NVLINK if pair(x, y) in nvlink else PathKind.SYSTEM
            for x, y in itertools.combinations(["GPU-a", "GPU-b", "GPU-c", "GPU-m"], 2)
        },
        {},
        {},
    )
    allocations = Allocations([holding(c, "split"), holding(instance, "split")])
    placed = place(topology, allocations, [], [a, b, c, mig_gpu])
    assert placed.paths == (PodPath("ml", "split", PathKind.SYSTEM, PathKind.NVLINK),), (
        "its instance's GPU is across the system from GPU c; a and b were free, on NVLink"
    )
    whole_only = place(topology, allocations, [], [c, mig_gpu])
    assert whole_only.paths[0].best == PathKind.SYSTEM, "the MIG-mode GPU itself is not free"
