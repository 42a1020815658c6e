"""The simulator as a DRA node (demo/scenarios/dra.yaml): claims in pod-resources, the driver's
CDI specs and mig-minors on disk, and the exporter attributing every claim from them."""

from __future__ import annotations

from pathlib import Path

from gpu_exporter.allocation.cdi import CdiReader
from gpu_exporter.collectors import Cadence
from gpu_exporter.config import SimulatorConfig
from gpu_exporter.simulator import SimulatedNode, load_scenario
from gpu_exporter.simulator.dra import ci_minor, gi_minor, mig_minors_text
from gpu_exporter.simulator.kubelet import SimulatedKubelet
from tests.helpers import ManualClock, make_config, parse_exposition, running_simulation, select

DRA_SCENARIO = Path(__file__).resolve().parents[2] / "demo" / "scenarios" / "dra.yaml"


async def test_the_kubelet_lists_claims_as_the_driver_names_them() -> None:
    clock = ManualClock()
    node = SimulatedNode(load_scenario(DRA_SCENARIO), clock=clock)
    kubelet = SimulatedKubelet(node)
    try:
        state = kubelet.state()
        assert state.containers == [], "claim-held devices are not device-plugin devices"
        assert state.allocatable is not None
        held = {node.gpus[0].uuid, node.gpus[1].uuid, node.gpus[2].migs[0].uuid}
        assert not held & {device for _, device in state.allocatable}
        listed = {(c.pod, c.claim_name, c.driver, c.device) for c in state.claims}
        mig = node.gpus[2].migs[0].spec
        mig_name = f"gpu-0-mig-3g40gb-{mig.profile.profile_id}-{mig.start_slice}"
        assert listed == {
            ("trainer-0", "trainer-gpu", "gpu.nvidia.com", "gpu-2"),  # GPU 0 has minor 2
            ("trainer-0", "trainer-imex-channel", "compute-domain.nvidia.com", "channel-0"),
            ("notebook-a", "shared-gpu", "gpu.nvidia.com", "gpu-3"),
            ("notebook-b", "shared-gpu", "gpu.nvidia.com", "gpu-3"),
            ("finetune", "small-mig", "gpu.nvidia.com", mig_name),
        }
        assert {c.pool for c in state.claims} == {"sim-dra-node"}
        await kubelet.refresh()
        index = CdiReader([kubelet.cdi_spec_dir], kubelet.nvidia_caps_path / "mig-minors").read()
        assert index.specs_read == 3  # one per claim of gpu.nvidia.com
        mig_claim = next(c for c in state.claims if c.claim_name == "small-mig")
        nodes = index.nodes(mig_claim.cdi_devices[-1])
        assert nodes is not None
        assert nodes.gpu_minors == (0,)
        gi = mig.gpu_instance_id
        assert nodes.cap_minors == (gi_minor(0, gi), ci_minor(0, gi, 0))
        assert index.mig_minors[ci_minor(0, gi, 0)].gpu_instance == gi
        # The timeline's claim (2m to 6m): its spec comes at Prepare and goes at Unprepare.
        clock.advance(3 * 60)
        await kubelet.refresh()
        assert CdiReader([kubelet.cdi_spec_dir], Path("/none")).read().specs_read == 4
        clock.advance(4 * 60)
        await kubelet.refresh()
        assert CdiReader([kubelet.cdi_spec_dir], Path("/none")).read().specs_read == 3
    finally:
        await kubelet.close()
        node.close()


def test_mig_minors_follow_the_drivers_layout() -> None:
    lines = mig_minors_text().splitlines()
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert "gpu0/gi1/access 12" in lines
    assert f"gpu1/gi0/access {gi_minor(1, 0)}" in lines


async def test_make_run_on_the_dra_scenario_attributes_every_claim() -> None:
    config = make_config(
        simulator=SimulatorConfig(DRA_SCENARIO), fast_interval=0.2, pod_resources_interval=0.2
    )
    async with running_simulation(config) as (exporter, simulated):
        assert exporter.allocation is not None
        await exporter.allocation.wait_for_poll()
        await exporter.sampler.wait_for_rounds(Cadence.FAST, 1)
        series = parse_exposition(exporter.sampler.exposition.text.decode())
    node = simulated.node
    info = {
        (labels["pod"], labels["resource"]): labels["uuid"]
        for labels in map(dict, select(series, "gpu_allocation_info"))
    }
    assert info == {
        ("trainer-0", "dra:ml/trainer-gpu"): node.gpus[0].uuid,
        ("notebook-a", "dra:research/shared-gpu"): node.gpus[1].uuid,
        ("notebook-b", "dra:research/shared-gpu"): node.gpus[1].uuid,
        ("finetune", "dra:batch/small-mig"): node.gpus[2].migs[0].uuid,
    }
    unresolved = select(series, "gpu_exporter_allocation_unresolved_total")
    assert sum(unresolved.values()) == 0, f"every claim resolves: {unresolved}"
