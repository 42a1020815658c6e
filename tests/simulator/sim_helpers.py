"""Shared helpers for the simulator tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

from collections.abc import Callable

from gpu_exporter.simulator import SimulatedNode


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


MakeNode = Callable[..., SimulatedNode]

ONE_H100 = """
gpus:
  - model: H100-SXM-80GB
"""
