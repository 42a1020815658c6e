"""The DCGM activity source end to end: a sampler on a simulated node whose fake host engine the
DCGM service polls, simulated time driven step by step (no sleeps)."""

from __future__ import annotations

import pytest

from gpu_exporter.allocation.accounting import IdleAccountant
from gpu_exporter.dcgm import structs as s
from gpu_exporter.dcgm.library import DcgmLibrary
from gpu_exporter.dcgm.readings import DcgmLink
from gpu_exporter.dcgm.service import DcgmService
from gpu_exporter.dcgm.target import Target
from gpu_exporter.ledger import ActivityKind
from tests.helpers import Series, one, select

from .helpers import A100_L40S, DcgmRig, dcgm_rig

RATIOS = (
    "gpu_sm_active_ratio",
    "gpu_tensor_active_ratio",
    "gpu_sm_occupancy_ratio",
)


def assert_no_sentinel(series: Series) -> None:
    """Every ratio is 0..1 and no value is one of DCGM's BLANK markers (2^47 and up)."""
    for (name, labels), value in series.items():
        assert value < s.FP64_BLANK, f"{name}{dict(labels)} = {value}: a DCGM sentinel leaked"
        if name in RATIOS:
            assert 0.0 <= value <= 1.0, f"{name}{dict(labels)} = {value} is not a ratio"


async def started(rig: DcgmRig) -> Series:
    """Connect, let the sampler rediscover the served devices, and take a first reading."""
    for _ in range(3):
        series = await rig.step()
    return series


async def test_sm_and_tensor_activity_of_gpus_without_gpm_come_from_dcgm() -> None:
    embedded = Target()
    async with dcgm_rig(A100_L40S, "--collector.activity.detail", target=embedded) as rig:
        start = await started(rig)
        for _ in range(60):
            end = await rig.step()
            assert_no_sentinel(end)
    a100, l40s = ({"gpu": "0"}, {"gpu": "1"})
    assert one(end, "gpu_info", **a100, activity_source="dcgm", idle_source="sm_active") == 1
    assert one(end, "gpu_info", **l40s, activity_source="dcgm", idle_source="sm_active") == 1
    assert one(end, "gpu_exporter_source_up", source="dcgm") == 1

    def rate(name: str, labels: dict[str, str]) -> float:
        return (one(end, name, **labels) - one(start, name, **labels)) / 60.0

    # Bursty 0.8 for 30% of each 10 s, else 0.1: mean 0.31; a 0 -> 0.5 ramp over 20 s: mean 0.25.
    assert rate("gpu_sm_active_seconds_total", a100) == pytest.approx(0.31, rel=0.05)
    assert rate("gpu_tensor_active_seconds_total", a100) == pytest.approx(0.25, rel=0.05)
    assert rate("gpu_sm_active_seconds_total", l40s) == pytest.approx(0.02, rel=0.05)
    assert one(end, "gpu_sm_occupancy_ratio", **l40s) == pytest.approx(0.5 * 0.02, rel=0.05)


async def test_idle_accounting_judges_by_dcgm_sm_activity_not_nvml_utilisation() -> None:
    async with dcgm_rig(A100_L40S) as rig:
        await started(rig)
        l40s = next(d.id for d in rig.sim.sampler.devices() if d.id.index == 1)
        assert l40s.dcgm_served
        accountant = IdleAccountant(rig.sim.shared.ledger, threshold=0.05)
        pod = ("research", "notebook")
        for _ in range(20):
            await rig.step()
            accountant.update(rig.sim.clock(), {l40s: {pod}})
        series = rig.series()
    (usage,) = list(accountant.usages())
    assert one(series, "gpu_utilization_ratio", gpu="1") == 1.0, "NVML says busy"
    assert rig.sim.shared.ledger.latest(l40s.uuid, ActivityKind.SM_ACTIVE) is not None
    assert usage.idle == pytest.approx(usage.allocated, abs=1.5), "SM 2% is idle"
    assert usage.allocated >= 18


async def test_gpm_stays_the_source_where_the_gpu_has_it() -> None:
    scenario = """
        gpus: [{model: H100-SXM-80GB}, {model: A100-SXM-80GB, mig: [3g.40gb, 1g.10gb]}]
        workloads:
          - {gpu: 0, pod: a, sm: 0.4}
          - {gpu: 1, mig: 0, pod: b, sm: 0.7, tensor: 0.2}
    """
    async with dcgm_rig(scenario) as rig:
        series = await started(rig)
        series = await rig.step()
        engine = rig.sim.node.dcgm
    assert one(series, "gpu_info", gpu="0", activity_source="gpm") == 1
    assert one(series, "gpu_info", gpu="1", activity_source="dcgm") == 1
    h100_gpu_id = engine.gpu_ids[0]
    assert (int(s.EntityGroup.GPU), h100_gpu_id) not in engine.watches, "DCGM left to GPM"
    big = one(series, "gpu_sm_active_ratio", mig_profile="3g.40gb")
    assert big == pytest.approx(0.7), "MIG instances mapped by parent UUID and GPU instance id"
    assert one(series, "gpu_tensor_active_ratio", mig_profile="3g.40gb") == pytest.approx(0.2)
    assert one(series, "gpu_sm_active_ratio", mig_profile="1g.10gb") == 0


async def test_fields_that_need_another_pass_are_not_watched() -> None:
    # V100 (invented metric groups): occupancy is a pass of its own, so only SM activity,
    # tensor and DRAM are watched; occupancy is omitted, never multiplexed or blank-filled.
    scenario = "gpus: [{model: V100-SXM2-32GB}]\nworkloads: [{gpu: 0, pod: p, sm: 0.5}]"
    async with dcgm_rig(scenario) as rig:
        await started(rig)
        series = await rig.step()
        watched = set(next(iter(rig.sim.node.dcgm.watches.values())))
    assert watched == {1002, 1004, 1005}
    assert one(series, "gpu_sm_active_ratio") == pytest.approx(0.5)
    assert select(series, "gpu_sm_occupancy_ratio") == {}


async def test_two_exporters_on_one_engine_do_not_clash_on_field_group_names() -> None:
    async with dcgm_rig(A100_L40S) as rig:
        other = DcgmService(
            library=lambda: DcgmLibrary(rig.sim.node.dcgm_library),
            target=Target("127.0.0.1:5555"),
            devices=rig.sim.sampler.devices,
            link=DcgmLink(),
            executor=rig.sim.sampler_pool,
            clock=rig.sim.clock,
        )
        await started(rig)
        await other.poll()
        names = [fg.name for fg in rig.sim.node.dcgm.field_groups.values()]
        errors = [line for line in other.samples() if line.family.name.endswith("errors_total")]
        await other.stop()
    assert other.up
    assert len(names) == 2, names
    assert len(set(names)) == 2, names
    assert errors == []


async def test_a_mig_reconfiguration_is_followed_by_new_watches_on_the_new_instances() -> None:
    scenario = """
        gpus: [{model: A100-SXM-80GB, mig: [3g.40gb, 1g.10gb]}]
        workloads: [{gpu: 0, mig: 0, pod: b, sm: 0.7}]
    """
    async with dcgm_rig(scenario) as rig:
        await started(rig)
        rig.inject({"type": "mig_reconfigure", "gpu": 0, "mig": ["2g.20gb", "2g.20gb"]})
        await rig.sim.slow_round()  # the sampler sees the new layout
        for _ in range(4):
            series = await rig.step()
    profiles = {
        dict(k)["mig_profile"]
        for k in select(series, "gpu_sm_active_ratio")
        if "mig_profile" in dict(k)
    }
    assert profiles == {"2g.20gb"}
    assert len(select(series, "gpu_sm_active_ratio", mig_profile="2g.20gb")) == 2
    assert_no_sentinel(series)
