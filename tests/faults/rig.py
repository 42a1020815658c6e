"""An exporter on a simulated node with a tally of every Xid injected into it.

Each fault test injects Xids before, during and after its fault and ends with
:meth:`Rig.assert_xids_exact`: every injected Xid counted once, none lost, none twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from gpu_exporter.app import Exporter
from gpu_exporter.config import SimulatorConfig
from gpu_exporter.simulator import SimulatedNode
from gpu_exporter.simulator.host import SimulatedHost
from tests.helpers import (
    Series,
    drained,
    make_config,
    parse_exposition,
    running_simulation,
    select,
)

# Three busy GPUs; GPU 0 is held by ml/trainer (pid 4242) through the simulated kubelet.
SCENARIO = """
gpus: [{model: H100-SXM-80GB, count: 3}]
workloads:
  - {gpu: 0, pod: trainer, namespace: ml, pid: 4242, process_name: python, sm: 0.9}
  - {gpu: 1, sm: 0.5}
  - {gpu: 2, sm: 0.3}
allocations:
  - {gpu: 0, pod: trainer, namespace: ml}
"""
MAX_RENDERS = 150  # at 0.2 s a fast round: 30 s before a condition is declared never met


@dataclass
class Rig:
    exporter: Exporter
    simulated: SimulatedHost
    injected: Counter[tuple[str, str]] = field(default_factory=Counter)  # (gpu, xid) -> count
    reports: int = 0  # Xid reports the two sources will deliver between them

    @property
    def node(self) -> SimulatedNode:
        return self.simulated.node

    def inject(self, event: dict[str, Any]) -> None:
        self.node.inject(event)

    def xid(self, gpu: int, code: int, delivery: str = "both") -> None:
        """Inject an Xid; ``both`` reaches the exporter twice (NVML event and kernel line)."""
        self.inject({"type": "xid", "gpu": gpu, "code": code, "delivery": delivery})
        self.injected[(str(gpu), str(code))] += 1
        self.reports += 2 if delivery == "both" else 1

    async def get(self, path: str) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{self.exporter.port}{path}") as response,
        ):
            return response.status, await response.text()

    async def scrape(self) -> Series:
        status, text = await self.get("/metrics")
        assert status == 200, f"/metrics answered {status}"
        return parse_exposition(text)

    async def until(self, condition: str, check: Callable[[Series], bool]) -> Series:
        """Scrape after each render until ``check`` holds; fail naming ``condition``."""
        series: Series = {}
        for _ in range(MAX_RENDERS):
            series = await self.scrape()
            if check(series):
                return series
            await self.exporter.sampler.wait_for_news()
        raise AssertionError(f"never saw: {condition}")

    async def settle(self) -> Series:
        """Wait until every report is counted or dropped as the other source's duplicate."""
        return await self.until(
            f"{self.reports} Xid reports accounted for",
            lambda s: sum(xid_counts(s).values()) + duplicates(s) >= self.reports,
        )

    async def assert_xids_exact(self) -> Series:
        """Once settled, each (gpu, xid) must have been counted exactly as often as injected."""
        series = await self.settle()
        assert xid_counts(series) == self.injected, (
            f"counted {dict(xid_counts(series))}, injected {dict(self.injected)}"
        )
        assert duplicates(series) == self.reports - self.injected.total(), "a report double counted"
        return series


def xid_counts(series: Series) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for labels, value in select(series, "gpu_xid_errors_total").items():
        found = dict(labels)
        counts[(found["gpu"], found["xid"])] += int(value)
    return +counts


def duplicates(series: Series) -> int:
    return int(sum(select(series, "gpu_exporter_xid_duplicates_total").values()))


def gpu_families(series: Series, gpu: str) -> set[str]:
    return {name for (name, labels) in series if ("gpu", gpu) in labels}


def drain(series: Series, gpu: str, reason: str) -> float:
    return drained(series, reason, gpu=gpu)


@asynccontextmanager
async def fault_rig(tmp_path: Path, scenario: str = SCENARIO, **config: Any) -> AsyncIterator[Rig]:
    scenario_file = tmp_path / "node.yaml"
    scenario_file.write_text(scenario)
    settings: dict[str, Any] = {
        "simulator": SimulatorConfig(scenario_file),
        "fast_interval": 0.2,
        "slow_interval": 0.5,
        "nvml_timeout": 0.3,
        "pod_resources_interval": 0.2,
        "kmsg_path": tmp_path / "kmsg",
        "state_dir": tmp_path / "state",
    }
    async with running_simulation(make_config(**{**settings, **config})) as (exporter, simulated):
        yield Rig(exporter, simulated)
