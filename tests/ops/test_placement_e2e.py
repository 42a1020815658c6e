"""Placement end to end with the real binaries: the exporter as a process on
demo/scenarios/placement.yaml (with its embedded DCGM for SM activity) and on the built-in HGX
node, Prometheus running the kit's rules (windows and ``for:`` shortened to seconds). Each case
of the scenario raises its alert, and the good placements stay quiet.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import pytest
import pytest_asyncio
import yaml
from demo.stack import (
    DEMO,
    RULE_FILES,
    ExporterProcess,
    PrometheusProcess,
    load_yaml,
    prometheus_config,
    shorten_rules,
    stop_all,
    wait_ready,
)

from tests.conftest import require_binary
from tests.ops.promquery import PrometheusQueries

pytestmark = pytest.mark.asyncio(loop_scope="module")

WINDOW = "15s"  # the starved pod's bursts are 10 s on, 10 s off: any 15 s window sees both
DEADLINE = 60.0


@dataclass
class Stack(PrometheusQueries):
    prometheus: PrometheusProcess
    exporters: list[ExporterProcess]
    session: aiohttp.ClientSession

    deadline: ClassVar[float] = DEADLINE

    def diagnostics(self) -> str:
        return "\n".join(f"--- {e.name}\n{e.output(10)}" for e in self.exporters)

    async def firing(self, alert: str) -> list[dict[str, str]]:
        result = await self.query(f'ALERTS{{alertname="{alert}",alertstate="firing"}}')
        return [r["metric"] for r in result]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack() -> AsyncIterator[Stack]:
    prometheus_binary = require_binary("prometheus")
    workdir = Path(tempfile.mkdtemp(prefix="gx-place-"))
    placement = DEMO / "scenarios" / "placement.yaml"
    exporters = [
        ExporterProcess("placement", placement, workdir / "placement", ["--dcgm.embedded"]),
        ExporterProcess("hgx", None, workdir / "hgx"),
    ]
    processes: list[Any] = list(exporters)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
    try:
        for exporter in exporters:
            await asyncio.to_thread(exporter.wait_listening)
        rule_paths = []
        for source in RULE_FILES:
            short = shorten_rules(load_yaml(source), window=WINDOW)
            rule_paths.append(workdir / source.name)
            rule_paths[-1].write_text(yaml.safe_dump(short, sort_keys=False))
        config = prometheus_config([e.address for e in exporters], rule_paths, None)
        prometheus = PrometheusProcess(prometheus_binary, config, workdir / "prometheus")
        processes.append(prometheus)
        await asyncio.to_thread(wait_ready, f"{prometheus.url}/-/ready", prometheus)
        built = Stack(prometheus, exporters, session)
        await built.eventually(
            'count(up{job="gpu-exporter"} == 1)',
            lambda r: bool(r) and float(r[0]["value"][1]) == len(exporters),
            "both exporters scraped",
        )
        yield built
    finally:
        await session.close()
        await asyncio.to_thread(stop_all, reversed(processes))
        shutil.rmtree(workdir, ignore_errors=True)


async def test_each_pod_of_two_or_more_gpus_has_its_path_and_the_best_the_node_had(
    stack: Stack,
) -> None:
    found = await stack.eventually(
        "gpu_allocation_path_info", lambda r: len(r) >= 2, "a path for each multi-GPU pod"
    )
    paths = {r["metric"]["pod"]: (r["metric"]["path"], r["metric"]["best_path"]) for r in found}
    assert paths["tp-split"] == ("system", "pcie_switch")
    assert paths["llama-pretrain-0"] == ("nvlink", "nvlink"), "the HGX trainer is on NVLink"


async def test_the_cross_socket_container_fires_and_the_aligned_ones_stay_quiet(
    stack: Stack,
) -> None:
    await stack.eventually(
        'ALERTS{alertname="GPUContainerCPUsOffGPUNUMANode",alertstate="firing"}',
        lambda r: bool(r),
        "the cross-socket container's alert",
    )
    pods = {labels["pod"] for labels in await stack.firing("GPUContainerCPUsOffGPUNUMANode")}
    assert pods == {"loader-far"}, "tp-split's CPUs are on one of its GPUs' node: quiet"


async def test_the_starved_holder_fires_and_the_steady_one_does_not(stack: Stack) -> None:
    await stack.eventually(
        'ALERTS{alertname="GPUHolderInputStarved",alertstate="firing"}',
        lambda r: bool(r),
        "the starved holder's alert",
    )
    steady = await stack.eventually(
        'holder:gpu_sm_shape:info{pod="steady"}', lambda r: bool(r), "the steady holder's shape"
    )
    assert steady[0]["metric"]["shape"] == "steady_low"
    pods = {labels["pod"] for labels in await stack.firing("GPUHolderInputStarved")}
    assert pods == {"starved"}


async def test_no_pod_missed_nvlink_and_no_workload_spans_domains(stack: Stack) -> None:
    # tp-split could have had one PCIe switch, not NVLink: the NVLink alert stays quiet, as it
    # does for the HGX trainer that has it.
    await stack.eventually(
        'ALERTS{alertname="GPUContainerCPUsOffGPUNUMANode",alertstate="firing"}',
        lambda r: bool(r),
        "the rules have run long enough for a 1 s for:",
    )
    assert await stack.firing("GPUPodMissedNVLink") == []
    assert await stack.firing("GPUWorkloadSpansNVLinkDomains") == []
