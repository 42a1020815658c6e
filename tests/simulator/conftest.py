"""Fixtures for simulator tests: a fake clock and nodes installed under the real pynvml."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import pynvml
import pytest

from gpu_exporter.simulator import SimulatedNode, install, loads_scenario, uninstall

from .sim_helpers import FakeClock, MakeNode


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_node(clock: FakeClock) -> Iterator[MakeNode]:
    """Build a node from scenario YAML, install it under pynvml and (by default) nvmlInit."""
    nodes: list[SimulatedNode] = []

    def make(yaml_text: str, *, init: bool = True) -> SimulatedNode:
        node = SimulatedNode(loads_scenario(textwrap.dedent(yaml_text), "test.yaml"), clock=clock)
        nodes.append(node)
        install(node)
        if init:
            pynvml.nvmlInit()
        return node

    yield make
    uninstall()
    for node in nodes:
        node.close()
