"""The simulated node's DCGM host engine, built when first reached, and its timeline events.

A scenario run that no DCGM client connects to (no ``--dcgm.*``, no ``dcgm_*`` event) never
imports the engine or the fake libdcgm, nor reads their tables (docs/performance.md, Peak RSS).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from gpu_exporter.simulator.dcgm_engine import DcgmEngine
    from gpu_exporter.simulator.dcgm_library import FakeDcgmLibrary
    from gpu_exporter.simulator.devices import GpuDevice
    from gpu_exporter.simulator.nodeview import NodeView


class DcgmHost:
    """Mixed into :class:`~gpu_exporter.simulator.node.SimulatedNode`: ``dcgm`` (the engine) and
    ``dcgm_library`` (the fake libdcgm that reaches it), and the ``dcgm_*`` event handlers."""

    lock: threading.RLock
    gpus: list[GpuDevice]
    _dcgm_parts: tuple[DcgmEngine, FakeDcgmLibrary] | None = None

    @property
    def dcgm(self) -> DcgmEngine:
        return self._dcgm()[0]

    @property
    def dcgm_library(self) -> FakeDcgmLibrary:
        return self._dcgm()[1]

    def _dcgm(self) -> tuple[DcgmEngine, FakeDcgmLibrary]:
        with self.lock:  # once, whichever thread reaches it first
            if self._dcgm_parts is None:
                from gpu_exporter.simulator.dcgm_engine import DcgmEngine
                from gpu_exporter.simulator.dcgm_library import FakeDcgmLibrary

                node = cast("NodeView", self)  # the node it is mixed into
                engine = DcgmEngine(node)
                self._dcgm_parts = engine, FakeDcgmLibrary(node, engine)
            return self._dcgm_parts

    def _on_dcgm_restart(self, p: Mapping[str, Any], t: float) -> None:
        self.dcgm.restart(p["downtime"])

    def _on_dcgm_profiling(self, p: Mapping[str, Any], t: float) -> None:
        held = {self.gpus[i].index for i in p["gpus"]}
        self.dcgm.hold_counters(held, p["state"] == "in_use")
