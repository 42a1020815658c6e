"""The simulated fleet of the end-to-end tests (demo/scenarios/node-*.yaml), the incidents injected
into it, and a stand-in kube-state-metrics target: one story that every engine the kit runs on
(Prometheus in test_e2e.py, VictoriaMetrics in test_victoriametrics.py) is told."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from demo.stack import DEMO, ExporterProcess, load_yaml

SCENARIOS = {name: DEMO / "scenarios" / f"{name}.yaml" for name in ("node-a", "node-b", "node-c")}
KSM_PATH = "/kube-state-metrics/metrics"

# NVSwitch 3 sits on PCI bus 0000:08:00.0 in the simulator.
FATAL_SXID = {"type": "sxid", "switch": 3, "code": 20034, "severity": "fatal", "link": 32}
NVLINK_DOWN = {"type": "nvlink_down", "gpu": 3, "link": 5}
PCIE_DOWNTRAIN = {"type": "pcie_downtrain", "gpu": 1, "width": 8}


def pod_labels_exposition() -> str:
    """kube-state-metrics' ``kube_pod_labels`` for every pod the scenarios allocate, each in the
    Kueue LocalQueue ``<namespace>-queue`` (as with --metric-labels-allowlist), and its
    ``kube_pod_owner``."""
    pods = {
        (item["namespace"], item["pod"])
        for path in SCENARIOS.values()
        for item in load_yaml(path).get("allocations", [])
    }
    lines = [
        f'kube_pod_labels{{namespace="{ns}",pod="{pod}",uid="{ns}-{pod}",'
        f'label_kueue_x_k8s_io_queue_name="{ns}-queue"}} 1'
        for ns, pod in sorted(pods)
    ]
    # Each pod owned by a workload named as the pod without its ordinal (trainer-0: trainer).
    owners = [
        f'kube_pod_owner{{namespace="{ns}",pod="{pod}",uid="{ns}-{pod}",owner_kind="StatefulSet",'
        f'owner_name="{pod.rsplit("-", 1)[0]}",owner_is_controller="true"}} 1'
        for ns, pod in sorted(pods)
    ]
    return (
        "# TYPE kube_pod_labels gauge\n"
        + "\n".join(lines)
        + "\n# TYPE kube_pod_owner gauge\n"
        + "\n".join(owners)
        + "\n"
    )


async def kube_state_metrics(request: web.Request) -> web.Response:
    """A stand-in kube-state-metrics target: the queue rules join its pod labels."""
    return web.Response(text=pod_labels_exposition(), content_type="text/plain")


def ksm_scrape_config(port: int) -> dict[str, Any]:
    return {
        "job_name": "kube-state-metrics",
        "metrics_path": KSM_PATH,
        "honor_labels": True,  # the pods' namespace/pod labels, as a real KSM job keeps them
        "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
    }


async def inject_incidents(exporters: Mapping[str, ExporterProcess]) -> None:
    """The incidents: a hardware Xid on a training GPU and a fatal NVSwitch SXid on node A, an
    application Xid in the inference server, thermal throttling and an uncorrectable ECC error on
    node C; and the interconnect faults: an NVLink link down on node A, node C's L40S trained to
    x8 (node C also has a GPU missing since boot, in its scenario)."""
    await asyncio.to_thread(
        exporters["node-a"].inject, {"type": "xid", "gpu": 1, "code": 48}, FATAL_SXID
    )
    await asyncio.to_thread(
        exporters["node-b"].inject,
        {"type": "xid", "gpu": 0, "code": 13, "pid": 52001, "process_name": "tritonserver"},
    )
    await asyncio.to_thread(
        exporters["node-c"].inject,
        {"type": "throttle", "gpu": 1, "reason": "hw_thermal_slowdown"},
        {"type": "ecc", "gpu": 0, "uncorrected": 1},
    )
    await asyncio.to_thread(exporters["node-a"].inject, NVLINK_DOWN)
    await asyncio.to_thread(exporters["node-c"].inject, PCIE_DOWNTRAIN)
