"""Scenario files: what is accepted, and the one-line errors for what is not."""

from __future__ import annotations

import pathlib
import textwrap

import pytest

from gpu_exporter.simulator import ScenarioError, SimulatedNode, load_scenario, loads_scenario
from gpu_exporter.simulator.patterns import Bursty, Ramp, Steady


def error_of(text: str) -> str:
    with pytest.raises(ScenarioError) as caught:
        loads_scenario(textwrap.dedent(text), "bad.yaml")
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_builtin_scenario_describes_the_demo_node() -> None:
    scenario = load_scenario(None)
    assert [g.model.key for g in scenario.gpus] == ["H100-SXM-80GB"] * 8
    assert scenario.gpus[6].mig is not None
    assert [m.profile.name for m in scenario.gpus[6].mig] == [
        "3g.40gb",
        "2g.20gb",
        "1g.10gb",
        "1g.10gb",
    ]
    namespaces = {w.namespace for w in scenario.workloads}
    assert {"ml-training", "inference", "research"} <= namespaces
    on_the_free_gpu = {(w.pod, w.unrequested, w.deleted) for w in scenario.workloads if w.gpu == 7}
    assert on_the_free_gpu == {
        ("debug-shell", True, False),  # no GPU request
        ("llama-pretrain-old", False, True),  # a zombie
    }, "GPU 7 runs only what the allocator never sees until the evaluation job lands"
    assert {e.type for e in scenario.timeline} >= {"throttle", "xid", "ecc", "allocate"}
    replicas = [a for a in scenario.allocations if a.replica is not None]
    assert {a.pod for a in replicas} == {"llm-serve-a", "llm-serve-b"}


def test_builtin_scenario_runs_its_timeline() -> None:
    now = [0.0]
    node = SimulatedNode(load_scenario(None), clock=lambda: now[0])
    now[0] = 20 * 60
    node.advance()
    assert any(": 13, pid=52001, name=tritonserver" in line for line in node.kmsg_lines)
    assert any(": 48, " in line for line in node.kmsg_lines)
    assert node.gpus[2].errors.remap_pending
    assert [a.spec.pod for a in node.allocations if a.spec.gpu == 7] == []
    node.close()


def test_a_complete_scenario(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        textwrap.dedent("""
        node: {name: n1, driver_version: "550.54.15", cuda_version: "12.4", uptime: 2h}
        gpus:
          - {model: H200-SXM-141GB, count: 2}
          - {model: A100-SXM-80GB, mig: [1g.10gb, 1g.10gb, 2g.20gb, 3g.40gb]}
        workloads:
          - gpu: 0
            memory: 100GiB
            sm: {pattern: bursty, value: 0.9, period: 1m, duty: 0.5}
            tensor: {pattern: ramp, from: 0, to: 80%, period: 5m}
            dram: 0.3
          - {gpu: 2, mig: 3, pod: p, memory: 512MiB, sm: idle}
        allocations:
          - {gpu: 0, pod: a, replica: 0}
          - {gpu: 0, pod: b, replica: 1, namespace: team-b, resource: nvidia.com/gpu.shared}
          - {gpu: 2, mig: 3, pod: p}
        timeline:
          - {at: 1m30s, type: throttle, gpu: all, reason: hw_thermal_slowdown, state: on}
          - {at: 2m, type: throttle, gpu: all, reason: hw_thermal_slowdown, state: off}
          - {at: 500ms, type: hang, function: nvmlDeviceGetPowerUsage, gpu: 1, duration: 5s}
        """)
    )
    scenario = load_scenario(path)
    assert scenario.source == str(path)
    assert len(scenario.gpus) == 3
    assert scenario.gpus[0].model.memory_mib == 143771
    first = scenario.workloads[0]
    assert first.memory == 100 * 2**30
    assert first.sm == Bursty(0.9, 60.0, 0.5)
    assert first.tensor == Ramp(0.0, 0.8, 300.0)
    assert first.dram == Steady(0.3)
    assert scenario.allocations[2].resource == "nvidia.com/mig-3g.40gb"
    assert [e.at for e in scenario.timeline] == [90.0, 120.0, 0.5]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpus: [{model: H100-SXM-80GB, colour: red}]", "bad.yaml: gpus[0].colour: unknown key"),
        ("gpus: [{model: B300}]", "bad.yaml: gpus[0].model: expected one of A100-SXM-80GB"),
        (
            "gpus: [{model: H100-SXM-80GB, count: two}]",
            "bad.yaml: gpus[0].count: expected an integer",
        ),
        ("gpus: []", "bad.yaml: gpus: at least one GPU is required"),
        ("node: {}", "bad.yaml: gpus: required key is missing"),
        (
            "gpus: [{model: L40S, mig: [1g.10gb]}]",
            "bad.yaml: gpus[0].mig: model L40S does not support MIG",
        ),
        (
            "gpus: [{model: H100-SXM-80GB, mig: [3g.71gb]}]",
            "bad.yaml: gpus[0].mig[0]: MIG profile '3g.71gb' is not valid for H100-SXM-80GB",
        ),
        (
            "gpus: [{model: H100-SXM-80GB, mig: [4g.40gb, 2g.20gb, 2g.20gb]}]",
            "bad.yaml: gpus[0].mig: instances need 8 slices, a H100-SXM-80GB has 7",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 1}]",
            "bad.yaml: workloads[0].gpu: gpu index 1 out of range (the node has 1 GPUs)",
        ),
        (
            "gpus: [{model: H100-SXM-80GB, mig: [7g.80gb]}]\nworkloads: [{gpu: 0}]",
            "bad.yaml: workloads[0].mig: gpu 0 is in MIG mode: name an instance 0..0",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, mig: 0}]",
            "bad.yaml: workloads[0].mig: gpu 0 is not in MIG mode",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, memory: 90GiB}]",
            "bad.yaml: workloads[0].memory: workloads need",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, memory: lots}]",
            "bad.yaml: workloads[0].memory: bad size 'lots'",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, sm: 1.5}]",
            "bad.yaml: workloads[0].sm: must be between 0 and 1",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, sm: {pattern: bursty, value: 1}}]",
            "bad.yaml: workloads[0].sm.duty: required key is missing",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, sm: {pattern: wobbly}}]",
            "bad.yaml: workloads[0].sm.pattern: expected one of bursty, idle, ramp, steady",
        ),
        (
            "gpus: [H100-SXM-80GB]\nallocations: [{gpu: 0}]",
            "bad.yaml: allocations[0].pod: required key is missing",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{type: xid, gpu: 0, code: 13}]",
            "bad.yaml: timeline[0].at: required key is missing",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: soon, type: gpu_lost, gpu: 0}]",
            "bad.yaml: timeline[0].at: bad duration 'soon'",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: meteor, gpu: 0}]",
            "bad.yaml: timeline[0].type: expected one of",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: xid, gpu: 0}]",
            "bad.yaml: timeline[0].code: required key is missing",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: throttle, gpu: 0, reason: tired}]",
            "bad.yaml: timeline[0].reason: expected one of",
        ),
        (
            "gpus: [H100-SXM-80GB]\n"
            "timeline: [{at: 1m, repeat: every now, type: gpu_lost, gpu: 0}]",
            "bad.yaml: timeline[0].repeat: bad duration 'now'",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: retired_pages, gpu: 0}]",
            "bad.yaml: timeline[0].gpu: gpu 0 (H100-SXM-80GB) has no page retirement",
        ),
        (
            "gpus: [V100-SXM2-32GB]\ntimeline: [{at: 1m, type: row_remap, gpu: 0}]",
            "bad.yaml: timeline[0].gpu: gpu 0 (V100-SXM2-32GB) has no row remapping",
        ),
        (
            "gpus: [{model: L40S, ecc: false}]\n"
            "timeline: [{at: 1m, type: ecc, gpu: 0, corrected: 1}]",
            "bad.yaml: timeline[0].gpu: ECC is disabled on gpu 0",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: hang, function: nvmlFly}]",
            "bad.yaml: timeline[0].function: expected one of",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: gpu_lost, gpu: [0, 3]}]",
            "bad.yaml: timeline[0].gpu[1]: gpu index 3 out of range",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: sxid, switch: 16, code: 12028}]",
            "bad.yaml: timeline[0].switch: must be <= 15, got 16",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: sxid, switch: -1, code: 12028}]",
            "bad.yaml: timeline[0].switch: must be >= 0, got -1",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: sxid, switch: 0}]",
            "bad.yaml: timeline[0].code: required key is missing",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: sxid, code: 12028}]",
            "bad.yaml: timeline[0].switch: required key is missing",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: sxid, switch: 0, code: 100000}]",
            "bad.yaml: timeline[0].code: must be <= 99999, got 100000",
        ),
        (
            "gpus: [H100-SXM-80GB]\n"
            "timeline: [{at: 1m, type: sxid, switch: 0, code: 1, severity: bad}]",
            "bad.yaml: timeline[0].severity: expected one of correctable, fatal, non_fatal; "
            "got 'bad'",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: sxid, switch: 0, code: 1, link: 64}]",
            "bad.yaml: timeline[0].link: must be <= 63, got 64",
        ),
        (
            "gpus: [H100-SXM-80GB]\ntimeline: [{at: 1m, type: sxid, switch: 0, code: 1, gpu: 0}]",
            "bad.yaml: timeline[0].gpu: unknown key (allowed: ",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, pod: p, unrequested: true}]\n"
            "allocations: [{gpu: 0, pod: p}]",
            "bad.yaml: workloads[0].unrequested: pod default/p holds this device",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, pod: p, reservation: kai/r}]",
            "bad.yaml: workloads[0].reservation: no allocation of this device to kai/r",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, pod: p, reservation: r}]",
            "bad.yaml: workloads[0].reservation: expected namespace/pod, got 'r'",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, pod: p, deleted: true}]\n"
            "allocations: [{gpu: 0, pod: p}]",
            "bad.yaml: workloads[0].deleted: pod default/p holds a device",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, pod: p, host: true}]",
            "bad.yaml: workloads[0].pod: a host process (host: true) has no pod",
        ),
        (
            "gpus: [H100-SXM-80GB]\nworkloads: [{gpu: 0, deleted: true}]",
            "bad.yaml: workloads[0].deleted: needs a pod",
        ),
        ("gpus: [H100-SXM-80GB]\nnode: {driver_version: latest}", "bad.yaml: node.driver_version:"),
        ("gpus: [H100-SXM-80GB", "bad.yaml: (yaml): expected ',' or ']'"),
        ("- just a list", "bad.yaml: (root): expected a mapping, got list"),
    ],
)
def test_invalid_scenarios_are_rejected_with_the_key_path(text: str, expected: str) -> None:
    assert error_of(text).startswith(expected)


def test_missing_file_is_a_scenario_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ScenarioError, match=r"nope.yaml: \(file\): No such file"):
        load_scenario(tmp_path / "nope.yaml")


def test_injected_events_are_validated_too() -> None:
    node = SimulatedNode(loads_scenario("gpus: [H100-SXM-80GB]"), clock=lambda: 0.0)
    with pytest.raises(ScenarioError, match=r"^<inject>: at: unknown key"):
        node.inject({"type": "gpu_lost", "gpu": 0, "at": "1m"})
    with pytest.raises(ScenarioError, match=r"^<inject>: gpu: gpu index 5 out of range"):
        node.inject({"type": "xid", "gpu": 5, "code": 13})
    with pytest.raises(ScenarioError, match=r"^<inject>: severity: expected one of correctable, "):
        node.inject({"type": "sxid", "switch": 0, "code": 1, "severity": "FATAL"})
    with pytest.raises(ScenarioError, match=r"^<inject>: port: unknown key"):
        node.inject({"type": "sxid", "switch": 0, "code": 1, "port": 3})
    node.close()
