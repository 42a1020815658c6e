"""The MIG profiles each MIG-capable GPU offers, MIG mode on or off, read through the real
pynvml module on the simulator (which answers profile queries as nvml.h says a driver does:
NotSupported while MIG is off and on GPUs without MIG) into the sampler's profile book, which
right-sizing reads and publishes per model (tests/allocation/test_rightsizing.py)."""

from __future__ import annotations

from importlib import resources

import pynvml
import pytest
import yaml

from gpu_exporter.migprofiles import _catalog, catalog_table
from tests.helpers import SimulatedSampler, simulated_sampler

SCENARIO = """
gpus:
  - H100-SXM-80GB
  - {model: H100-SXM-80GB, mig: [3g.40gb, 3g.40gb]}
  - L40S
  - A100-SXM-80GB
"""
PROFILE_CALL = "nvmlDeviceGetGpuInstanceProfileInfoV"


def profiles(sim: SimulatedSampler, gpu: int) -> dict[str, tuple[float, int]]:
    """profile -> (compute fraction, memory MiB) the book holds for GPU ``gpu``."""
    table = sim.shared.mig_profiles.table(sim.node.gpus[gpu].uuid)
    if table is None:
        return {}
    return {p.name: (table.compute_fraction(p), p.memory_mib) for p in table.profiles}


async def test_profiles_are_read_with_mig_on_or_off_and_not_for_gpus_without_mig() -> None:
    async with simulated_sampler(SCENARIO) as sim:
        series = await sim.slow_round()

        mig_off = profiles(sim, 0)
        assert mig_off["1g.10gb"][0] == pytest.approx(1 / 7)
        assert mig_off["2g.20gb"][0] == pytest.approx(2 / 7)
        assert mig_off["7g.80gb"][0] == 1.0
        assert "1g.10gb+me" in mig_off, "MIG off: NVML lists none, the catalog answers"
        assert mig_off["1g.20gb"][1] == 19968

        mig_on = profiles(sim, 1)
        assert mig_on["3g.40gb"] == (pytest.approx(3 / 7), 40192)
        assert "1g.10gb+me" not in mig_on, "MIG on: NVML's own table (the simulated one lacks +me)"

        assert profiles(sim, 2) == {}, "L40S has no MIG: nothing read"
        assert profiles(sim, 3)["1g.20gb"][0] == pytest.approx(1 / 7), "A100 80GB, MIG off"
        fractions = sim.shared.mig_profiles.compute_fractions()
        assert fractions[("NVIDIA H100 80GB HBM3", "3g.40gb")] == pytest.approx(3 / 7)
        assert fractions[("NVIDIA A100-SXM4-80GB", "1g.20gb")] == pytest.approx(1 / 7)
    assert not [name for name, _ in series if name.startswith("gpu_mig_profile")], (
        "a model's constants are not a series per GPU"
    )


async def test_the_table_is_read_once_per_gpu_and_gpus_without_mig_cost_no_call() -> None:
    async with simulated_sampler(SCENARIO) as sim:
        await sim.slow_round()
        asked = sim.node.calls[PROFILE_CALL]
        assert asked > 0
        await sim.slow_round()
        assert sim.node.calls[PROFILE_CALL] == asked, "profiles are fixed: not asked again"
        assert profiles(sim, 0), "and still known"

        l40s = pynvml.nvmlDeviceGetHandleByIndex(2)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo(l40s, 0)
        h100_mig_off = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h100_mig_off, 0)


def test_the_catalog_agrees_with_the_simulated_models_where_both_list_a_profile() -> None:
    """The simulator's catalogue stands in for a driver: where both have a profile, the memory
    and slices match, so MIG on (NVML) and MIG off (catalog) publish the same figures."""
    text = resources.files("gpu_exporter.simulator").joinpath("data/models.yaml").read_text()
    for key, model in yaml.safe_load(text).items():
        simulated = model.get("mig_profiles") or {}
        table = catalog_table(model["name"])
        if not simulated:
            continue
        assert table is not None, f"{key} ({model['name']}) has MIG profiles but no catalog rows"
        listed = {p.name: p for p in table.profiles}
        for name, spec in simulated.items():
            assert name in listed, f"{key}: {name} missing from data/mig_profiles.tsv"
            assert (listed[name].slices, listed[name].memory_mib) == (
                spec["slices"],
                spec["memory_mib"],
            ), f"{key} {name}: catalog and simulator disagree"


def test_every_catalog_table_has_its_whole_gpu_profile() -> None:
    for model, table in _catalog().items():
        assert max(p.slices for p in table.profiles) == table.total_slices, model
        assert all(0 < p.slices <= table.total_slices for p in table.profiles), model
