"""A simulated node's fake libdcgm under the real binding, and a sampler fed by the DCGM service."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

from gpu_exporter.collectors import Cadence
from gpu_exporter.dcgm.library import DcgmLibrary
from gpu_exporter.dcgm.service import DcgmService
from gpu_exporter.dcgm.target import Target, parse_target
from gpu_exporter.simulator import SimulatedNode, loads_scenario
from tests.helpers import ManualClock, Series, SimulatedSampler, simulated_sampler

A100_L40S = """
    gpus: [{model: A100-SXM-80GB}, {model: L40S}]
    workloads:
      - {gpu: 0, pod: train, sm: {pattern: bursty, value: 0.8, low: 0.1, period: 10s, duty: 0.3},
         tensor: {pattern: ramp, from: 0.0, to: 0.5, period: 20s}}
      - {gpu: 1, pod: notebook, sm: 0.02, utilization: 1.0}
"""


@contextmanager
def fake_library(scenario: str) -> Iterator[tuple[SimulatedNode, DcgmLibrary, ManualClock]]:
    """The binding over a node's fake libdcgm (no pynvml involved), initialised."""
    clock = ManualClock()
    node = SimulatedNode(loads_scenario(textwrap.dedent(scenario), "<test>"), clock=clock)
    try:
        lib = DcgmLibrary(node.dcgm_library)
        lib.init()
        yield node, lib, clock
    finally:
        node.close()


@dataclass
class DcgmRig:
    """A sampler on a simulated node with the DCGM service, both driven step by step."""

    sim: SimulatedSampler
    service: DcgmService

    async def step(self, seconds: float = 1.0) -> Series:
        """Simulated time moves on; the service polls the engine; a fast round samples."""
        self.sim.clock.advance(seconds)
        await self.service.poll()
        await self.sim.sampler.sample_round(Cadence.FAST)
        return self.series()

    def series(self) -> Series:
        return self.sim.series()

    def inject(self, event: dict[str, Any]) -> None:
        self.sim.inject(event)


@asynccontextmanager
async def dcgm_rig(
    scenario: str,
    *flags: str,
    target: Target | None = None,
    call_timeout: float = 5.0,
    **config: Any,
) -> AsyncIterator[DcgmRig]:
    """``flags``: collector options as typed (``--collector.activity.detail``)."""
    async with simulated_sampler(scenario, *flags, **config) as sim:
        service = DcgmService(
            library=lambda: DcgmLibrary(sim.node.dcgm_library),
            target=target or parse_target("127.0.0.1:5555"),
            devices=sim.sampler.devices,
            link=sim.shared.dcgm,
            executor=sim.sampler_pool,
            interval=1.0,
            call_timeout=call_timeout,
            clock=sim.clock,
        )
        sim.sampler.add_source(service)
        try:
            yield DcgmRig(sim, service)
        finally:
            await service.stop()
