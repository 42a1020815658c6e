"""DRA end to end, across process boundaries: a stand-in kubelet generated from the upstream
proto serves DRA claims to the exporter, run as users run it (``--simulate`` with
``--pod-resources-socket``), and the exporter attributes the simulated GPUs from the node alone.

The kubelet also answers GetAllocatableResources as one with that feature gate off does
(UNKNOWN "... disabled"), so the source must stay up on List alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.simulator import SimulatedNode, loads_scenario
from tests.helpers import Series, parse_exposition, select

from .test_proto import UPSTREAM_PROTO, needs_grpc_tools

HERE = Path(__file__).parent
SCENARIO = """
node: {name: dra-node}
gpus:
  - {model: H100-SXM-80GB, count: 2, minor: 5}
  - {model: H100-SXM-80GB, mig: [3g.40gb, 1g.10gb], minor: 0}
"""
POOL = "dra-node"
CDI_KIND = "k8s.gpu.nvidia.com/claim"
WHOLE_UID = "8c6ac9b4-0000-4000-8000-00000000000a"
MIG_UID = "8c6ac9b4-0000-4000-8000-00000000000b"
# The host's mig-minors (test data, not the simulator's numbering): GPU minor 0, GI 2, CI 0.
GI_CAP, CI_CAP = 21, 22
LIMIT = 30.0


@dataclass
class Exporter:
    process: subprocess.Popen[str]
    port: int
    log: list[dict[str, Any]] = field(default_factory=list)

    def scrape(self) -> Series:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return parse_exposition(response.read().decode())

    def until(self, condition: str, check: Any) -> Series:
        """Scrape until ``check`` holds (a process boundary: there is no event to await)."""
        deadline = time.monotonic() + LIMIT
        series: Series = {}
        while time.monotonic() < deadline:
            series = self.scrape()
            if check(series):
                return series
            time.sleep(0.05)
        raise AssertionError(f"never saw: {condition}; last allocation series: {dra(series)}")


def dra(series: Series) -> dict[str, str]:
    """resource -> uuid of every gpu_allocation_info series of a DRA claim."""
    return {
        labels["resource"]: labels["uuid"]
        for key in select(series, "gpu_allocation_info")
        if (labels := dict(key))["resource"].startswith("dra:")
    }


def allocated(series: Series) -> dict[str, float]:
    return {dict(key)["uuid"]: value for key, value in select(series, "gpu_allocated").items()}


def claim(namespace: str, name: str, device: str, *cdi: str, driver: str = "gpu.nvidia.com"):  # type: ignore[no-untyped-def]
    resource = {"driver_name": driver, "pool_name": POOL, "device_name": device}
    if cdi:
        resource["cdi_devices"] = [{"name": n} for n in cdi]
    return {"claim_namespace": namespace, "claim_name": name, "claim_resources": [resource]}


def pod(namespace: str, name: str, *claims: dict[str, Any]) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "name": name,
        "containers": [{"name": "main", "dynamic_resources": list(claims)}],
    }


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ga-dra-"))  # unix socket paths: ~107 bytes at most
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node() -> Iterator[SimulatedNode]:
    """The scenario's devices, read independently of the exporter (UUIDs, MIG placement)."""
    simulated = SimulatedNode(loads_scenario(SCENARIO, "<test>"))
    yield simulated
    simulated.close()


def start_kubelet(root: Path, state: dict[str, Any]) -> subprocess.Popen[str]:
    stubs = root / "stubs"
    stubs.mkdir()
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{UPSTREAM_PROTO.parent}",
            f"--python_out={stubs}", f"--grpc_python_out={stubs}", UPSTREAM_PROTO.name,
        ],
        check=True,
    )  # fmt: skip
    (root / "state.json").write_text(json.dumps(state))
    kubelet = subprocess.Popen(
        [sys.executable, HERE / "upstream_kubelet.py", stubs, root / "k.sock", root / "state.json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert kubelet.stdout is not None
    assert kubelet.stdout.readline().strip() == "ready", "the stand-in kubelet did not start"
    return kubelet


def start_exporter(root: Path) -> Exporter:
    (root / "node.yaml").write_text(SCENARIO)
    process = subprocess.Popen(
        [
            sys.executable, "-m", "gpu_exporter", "--log-format=json", "--log-level=debug",
            "--listen=127.0.0.1:0", "--fast-interval=200ms", "--pod-resources-interval=200ms",
            f"--simulate={root / 'node.yaml'}", f"--pod-resources-socket={root / 'k.sock'}",
            f"--cdi-spec-dir={root / 'cdi'}", f"--cdi-spec-dir={root / 'no-such-dir'}",
            f"--nvidia-caps-path={root / 'caps'}", f"--state-dir={root / 'state'}",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stderr is not None
    for line in process.stderr:
        if json.loads(line).get("event") == "listening":
            port = int(json.loads(line)["address"].rsplit(":", 1)[1])
            break
    else:
        raise AssertionError(f"exporter exited with {process.wait()} before listening")
    exporter = Exporter(process, port)

    def drain() -> None:  # keep reading: a full pipe would block the exporter
        assert process.stderr is not None
        for text in process.stderr:
            exporter.log.append(json.loads(text))

    threading.Thread(target=drain, daemon=True).start()
    return exporter


def write_specs(root: Path, mig_name: str) -> None:
    cdi = root / "cdi"
    cdi.mkdir()
    whole = {
        "cdiVersion": "0.8.0",
        "kind": CDI_KIND,
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
        "devices": [
            {
                "name": f"{WHOLE_UID}-gpu-6",
                "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia6"}]},
            }
        ],
    }
    caps = [
        {"path": f"/dev/nvidia-caps/nvidia-cap{m}", "type": "c", "major": 508, "minor": m}
        for m in (GI_CAP, CI_CAP)
    ]
    mig = {
        "cdiVersion": "0.8.0",
        "kind": CDI_KIND,
        "devices": [
            {
                "name": f"{MIG_UID}-{mig_name}",
                "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}, *caps]},
            }
        ],
    }
    (cdi / f"k8s.gpu.nvidia.com-claim_{WHOLE_UID}.yaml").write_text(yaml.safe_dump(whole))
    (cdi / f"k8s.gpu.nvidia.com-claim_{MIG_UID}.json").write_text(json.dumps(mig))
    (root / "caps").mkdir()
    (root / "caps" / "mig-minors").write_text(
        f"config 1\nmonitor 2\ngpu0/gi2/access {GI_CAP}\ngpu0/gi2/ci0/access {CI_CAP}\n"
    )


@needs_grpc_tools
def test_dra_claims_from_an_upstream_built_kubelet_are_attributed(
    short_dir: Path, node: SimulatedNode
) -> None:
    whole_gpu = node.gpus[1]  # minor 6: "gpu-6" is not NVML index 6 (there is none)
    mig = node.gpus[2].migs[1]  # 1g.10gb on the GPU of minor 0
    assert mig.spec.gpu_instance_id == 2, "the test's mig-minors assumes GPU instance 2"
    profile, start = mig.spec.profile, mig.spec.start_slice
    mig_name = f"gpu-0-mig-{profile.name.replace('.', '')}-{profile.profile_id}-{start}"
    write_specs(short_dir, mig_name)
    state: dict[str, Any] = {
        "list": {
            "pod_resources": [
                pod(
                    "ml", "trainer",
                    claim("ml", "whole", "gpu-6", f"{CDI_KIND}={WHOLE_UID}-gpu-6"),
                    claim("ml", "imex", "channel-0", driver="compute-domain.nvidia.com"),
                ),
                pod(
                    "batch", "small",
                    claim("batch", "mig", mig_name, f"{CDI_KIND}={MIG_UID}-{mig_name}"),
                ),
            ]
        }
    }  # fmt: skip
    kubelet = start_kubelet(short_dir, state)
    exporter = start_exporter(short_dir)
    try:
        series = exporter.until("both DRA claims attributed", lambda s: len(dra(s)) == 2)
        assert dra(series) == {"dra:ml/whole": whole_gpu.uuid, "dra:batch/mig": mig.uuid}
        held = {uuid for uuid, value in allocated(series).items() if value == 1}
        assert held == {whole_gpu.uuid, mig.uuid}, "gpu_allocated 1 for exactly the claimed"
        assert allocated(series).keys() == {
            node.gpus[0].uuid,
            whole_gpu.uuid,
            node.gpus[2].migs[0].uuid,
            mig.uuid,
        }, "every schedulable device has gpu_allocated"
        up = select(series, "gpu_exporter_source_up", source="pod_resources")
        assert list(up.values()) == [1.0], "GetAllocatableResources disabled took the source down"

        # The specs go away (claims unprepared, or no mount): the device names still resolve.
        shutil.rmtree(short_dir / "cdi")
        state["list"]["pod_resources"] = [
            pod("ml", "trainer", claim("ml", "whole-2", "gpu-6", f"{CDI_KIND}={WHOLE_UID}-gpu-6")),
            pod("batch", "small", claim("batch", "mig-2", mig_name)),
            pod("lab", "odd", claim("lab", "odd", "accelerator-7")),
        ]
        (short_dir / "state.json").write_text(json.dumps(state))
        series = exporter.until(
            "the fallback's claims",
            lambda s: {"dra:ml/whole-2", "dra:batch/mig-2"} <= dra(s).keys(),
        )
        assert dra(series) == {"dra:ml/whole-2": whole_gpu.uuid, "dra:batch/mig-2": mig.uuid}
        unresolved = select(series, "gpu_exporter_allocation_unresolved_total")
        assert unresolved[frozenset({("reason", "unknown_device_name")})] == 1
        assert sum(unresolved.values()) == 1, f"only the unknown name is unresolved: {unresolved}"
    finally:
        for process in (exporter.process, kubelet):
            process.terminate()
            process.wait(timeout=10)
    logged = [e for e in exporter.log if e.get("event") == "DRA device resolves to no GPU"]
    assert logged, "the unresolvable claim was not logged"
    assert logged[0]["claim"] == "lab/odd"
    assert logged[0]["device"] == f"gpu.nvidia.com/{POOL}/accelerator-7"
    assert any("compute-domain" in str(e.get("event")) for e in exporter.log)
