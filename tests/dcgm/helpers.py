"""A simulated node's fake libdcgm under the real binding."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

from gpu_exporter.dcgm import DcgmLibrary
from gpu_exporter.simulator import SimulatedNode, loads_scenario
from tests.helpers import ManualClock

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
