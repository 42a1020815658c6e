"""Right-sizing: peak memory and the smallest fitting MIG profile per whole-GPU allocation.

The acceptance test runs the exporter's parts as app.py wires them (sampler and every collector,
allocation through the simulated kubelet's real gRPC and host /proc) on the built-in scenario,
driven round by round on a manual clock. The rest pins the rule down on the RightSizer itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_exporter.allocation.rightsizing import (
    BUCKETS,
    WHOLE_GPU,
    ActivityHistogram,
    RightSizer,
    smallest_fit,
)
from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.collectors import Cadence
from gpu_exporter.devices import DeviceId
from gpu_exporter.exposition import render
from gpu_exporter.ledger import ActivityKind, ActivityLedger
from gpu_exporter.migprofiles import MigProfileBook, catalog_table
from gpu_exporter.nvml import WorkerPool
from gpu_exporter.sampler import Sampler
from gpu_exporter.simulator import SimulatedNode, install, load_scenario, uninstall
from gpu_exporter.simulator.kubelet import SimulatedKubelet
from tests.helpers import ManualClock, Series, SharedState, make_config, parse_exposition, select

from .helpers import GPU_A, MIG_B1

GIB = 2**30
FIT = "gpu_allocation_smallest_fitting_profile_info"
PEAK = "gpu_allocation_memory_peak_bytes"
H100 = catalog_table("NVIDIA H100 80GB HBM3")


@dataclass
class Node:
    sampler: Sampler
    allocation: AllocationSubsystem
    kubelet: SimulatedKubelet
    clock: ManualClock

    async def run(self, seconds: int) -> Series:
        """One slow round, then a fast round and two allocation updates per second, then a
        process scan: what the background loops do, in order, without waiting for them."""
        await self.kubelet.refresh()
        await self.allocation.poll()
        await self.sampler.sample_round(Cadence.SLOW)
        for _ in range(seconds):
            self.clock.advance(0.5)
            self.allocation.round_done()
            self.clock.advance(0.5)
            await self.sampler.sample_round(Cadence.FAST)
            self.allocation.round_done()
        await self.allocation.scan_processes()
        self.sampler.note_news()
        return parse_exposition(self.sampler.exposition.text.decode())


@pytest.fixture
async def builtin_node(short_dir: Path) -> AsyncIterator[Node]:
    clock = ManualClock()
    node = SimulatedNode(load_scenario(None), clock=clock)
    install(node)
    pool = WorkerPool(size=4)
    kubelet = SimulatedKubelet(node, short_dir / "kubelet.sock", files_root=short_dir / "host")
    shared = SharedState()
    sampler = shared.sampler(make_config(fast_interval=60.0, slow_interval=60.0), pool, clock=clock)
    allocation = AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket_path,
            proc_path=kubelet.proc_path,
            pod_logs_path=kubelet.pod_logs_path,
        ),
        devices=sampler.devices,
        ledger=shared.ledger,
        mig_profiles=shared.mig_profiles,
        executor=pool,
        errors=shared.errors,
        clock=clock,
    )
    sampler.add_source(allocation)
    try:
        await kubelet.start()
        await sampler.start(background=False)
        yield Node(sampler, allocation, kubelet, clock)
    finally:
        await allocation.stop()
        await sampler.stop()
        await kubelet.stop()
        pool.shutdown()
        node.close()
        uninstall()


def fits(series: Series, **labels: str) -> dict[str, str]:
    """gpu -> profile of every fit series matching ``labels``."""
    found = select(series, FIT, **labels)
    assert all(v == 1 for v in found.values()), f"a fit series is not 1: {found}"
    return {dict(key)["gpu"]: dict(key)["profile"] for key in found}


async def test_the_idle_notebook_fits_a_small_profile_and_the_training_job_does_not(
    builtin_node: Node,
) -> None:
    series = await builtin_node.run(seconds=20)

    notebook = fits(series, namespace="research", pod="jupyter-alice")
    assert notebook == {"5": "1g.20gb"}, (
        "the idle notebook's 12 GiB (+10% = 13.2 GiB) exceeds 1g.10gb and its SM p95 of ~0 fits "
        f"one slice: 1g.20gb, got {notebook}"
    )
    (peak,) = select(series, PEAK, gpu="5", pod="jupyter-alice").values()
    assert peak == 12 * GIB, "peak framebuffer = the notebook process's 12 GiB"

    training = fits(series, namespace="ml-training", pod="llama-pretrain-0")
    assert training == dict.fromkeys("0123", WHOLE_GPU), (
        f"71 GiB at ~92% SM fits no MIG profile smaller than the GPU: {training}"
    )


async def test_mig_instances_and_time_sliced_gpus_get_a_peak_but_no_fit(builtin_node: Node) -> None:
    series = await builtin_node.run(seconds=5)

    assert set(fits(series)) == {"0", "1", "2", "3", "5"}, (
        "fits only for whole GPUs held by one pod: not GPU 4 (time-sliced), not GPU 6 (MIG)"
    )
    serving = select(series, PEAK, gpu="4")
    assert sorted(serving.values()) == [30 * GIB, 30 * GIB], (
        f"each time-sliced pod has its own peak: {serving}"
    )
    mig_peaks = select(series, PEAK, gpu="6")
    assert {dict(k)["pod"] for k in mig_peaks} == {
        "finetune-small",
        "embeddings-batch",
        "jupyter-bob",
    }, "MIG allocations carry their peak (with the instance's labels)"
    assert all("gpu_instance_id" in dict(k) for k in mig_peaks)


async def test_the_reclaimable_join_finds_the_notebooks_profile_fraction(
    builtin_node: Node,
) -> None:
    """What namespace:gpu_reclaimable:sum joins on must exist: the fit's GPU's model in gpu_info,
    and that model's fraction for the profile, once per node."""
    series = await builtin_node.run(seconds=5)

    ((labels, _),) = select(series, FIT, pod="jupyter-alice").items()
    fit = dict(labels)
    ((info, _),) = select(series, "gpu_info", uuid=fit["uuid"]).items()
    model = dict(info)["model"]
    fraction = select(
        series, "gpu_mig_profile_compute_fraction", model=model, profile=fit["profile"]
    )
    assert list(fraction.values()) == [pytest.approx(1 / 7)], (
        "the fit's profile is published for its GPU's model (MIG off: from the catalog)"
    )
    for key in select(series, "gpu_mig_profile_compute_fraction"):
        assert {name for name, _ in key} == {"model", "profile"}, "per model, not per GPU"


# -- the rule ---------------------------------------------------------------------------------


def test_the_fit_needs_memory_with_headroom_and_compute_at_the_p95() -> None:
    assert H100 is not None
    assert smallest_fit(H100, 8 * GIB, 0.0) == "1g.10gb"  # 8.8 GiB <= 9.625 GiB
    assert smallest_fit(H100, 9 * GIB, 0.0) == "1g.20gb", "9 GiB + 10% overflows 1g.10gb"
    assert smallest_fit(H100, 9 * GIB, 2 / 7) == "2g.20gb", "2/7 is covered by 2 slices exactly"
    assert smallest_fit(H100, 9 * GIB, 2 / 7 + 1 / BUCKETS) == "3g.40gb"
    assert smallest_fit(H100, 40 * GIB, 0.1) == WHOLE_GPU, "44 GiB needs the 7g profile: no gain"
    assert smallest_fit(H100, 1 * GIB, 0.95) == WHOLE_GPU, "busy: only all seven slices cover it"


def test_the_p95_is_time_weighted_and_rounded_up_to_a_bucket_edge() -> None:
    histogram = ActivityHistogram()
    assert histogram.quantile_edge() is None, "no activity seen: no p95 (and no fit)"
    histogram.add(0.0, 96.0)
    histogram.add(0.9, 4.0)
    assert histogram.quantile_edge() == 1 / BUCKETS, "4% of the time busy: p95 is idle"
    histogram.add(0.9, 2.0)
    assert histogram.quantile_edge() == 26 / BUCKETS, "~6% busy at 0.9: p95 is 0.9's bucket"
    edges = ActivityHistogram()
    edges.add(2 / 7, 1.0)
    assert edges.quantile_edge() == 2 / 7, "a slice fraction is an edge: 2/7 stays 2/7"


@dataclass
class Rig:
    ledger: ActivityLedger
    sizer: RightSizer
    book: MigProfileBook
    now: float = 0.0
    sm_total: float = 0.0

    def second(self, held: dict, sm: float) -> None:  # type: ignore[type-arg]
        self.now += 1.0
        self.sm_total += sm
        self.ledger.record(GPU_A.uuid, ActivityKind.SM_ACTIVE, self.now, self.sm_total)
        self.sizer.update(self.now, held)

    def fits(self) -> dict[tuple[str, str], str]:
        text = render(list(self.sizer.samples()), ()).text.decode()
        return {
            (dict(k)["uuid"], dict(k)["pod"]): dict(k)["profile"]
            for k in select(parse_exposition(text), FIT)
        }


@pytest.fixture
def rig() -> Rig:
    ledger, book = ActivityLedger(), MigProfileBook()
    assert H100 is not None
    book.record(GPU_A.uuid, H100)
    return Rig(ledger, RightSizer(ledger, book), book)


def test_the_peak_is_the_highest_scan_and_release_forgets_the_allocation(rig: Rig) -> None:
    pod = ("ns", "p")
    held = {GPU_A: {pod}}
    for _ in range(3):
        rig.second(held, 0.0)
    rig.sizer.observe_memory({(GPU_A, "ns", "p", "c"): [6 * GIB, 2 * GIB]})
    rig.sizer.observe_memory({(GPU_A, "ns", "p", "c"): [1 * GIB, None]})
    assert rig.fits() == {(GPU_A.uuid, "p"): "1g.10gb"}, "peak 8 GiB of two processes, idle"
    rig.second({}, 0.0)
    assert rig.fits() == {}, "released: forgotten at once"
    rig.second(held, 0.0)
    rig.sizer.observe_memory({(GPU_A, "ns", "p", "c"): [1 * GIB]})
    rig.second(held, 0.0)
    assert rig.fits() == {(GPU_A.uuid, "p"): "1g.10gb"}
    peaks = [s.value for s in rig.sizer.samples() if s.family.name == PEAK]
    assert peaks == [1 * GIB], "a new allocation starts a new peak"


def test_activity_before_the_allocation_began_is_not_its_own(rig: Rig) -> None:
    rig.second({}, 1.0)  # busy before anyone holds it
    held = {GPU_A: {("ns", "p")}}
    rig.second(held, 1.0)  # the interval ending now began before the allocation
    for _ in range(20):
        rig.second(held, 0.0)
    rig.sizer.observe_memory({(GPU_A, "ns", "p", "c"): [1 * GIB]})
    assert rig.fits() == {(GPU_A.uuid, "p"): "1g.10gb"}


def test_no_fit_without_a_profile_table_for_shared_devices_or_on_mig_instances(rig: Rig) -> None:
    rig.book = MigProfileBook()
    sizer = RightSizer(rig.ledger, rig.book)
    shared = {GPU_A: {("ns", "a"), ("ns", "b")}, MIG_B1: {("ns", "m")}}
    for _ in range(3):
        rig.now += 1.0
        rig.sm_total += 0.0
        rig.ledger.record(GPU_A.uuid, ActivityKind.SM_ACTIVE, rig.now, rig.sm_total)
        sizer.update(rig.now, shared)
    memory: dict[tuple[DeviceId, str, str, str], list[int | None]] = {
        (GPU_A, "ns", "a", "c"): [GIB],
        (GPU_A, "ns", "b", "c"): [GIB],
    }
    sizer.observe_memory({**memory, (MIG_B1, "ns", "m", "c"): [GIB]})
    names = [s.family.name for s in sizer.samples()]
    assert names == [PEAK, PEAK, PEAK], f"peaks only: {names}"
