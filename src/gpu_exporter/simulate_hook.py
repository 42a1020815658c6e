"""The simulated node under any Python program's ``pynvml`` (``gpu-exporter-simulate``).

``gpu-exporter-simulate`` puts ``simulate_startup/sitecustomize.py`` on ``PYTHONPATH``; the
interpreter runs it at start-up and it calls :func:`activate`. That only registers an import hook
(this module imports only the standard library): nothing is built unless the program imports
``pynvml``. When it does, pynvml's library loader is replaced so that the first ``nvmlInit``
builds the node from the scenario and installs it instead of loading ``libnvidia-ml.so.1``.
Every process of the command builds its own node from the same scenario and the same start time
(``GPU_EXPORTER_SIMULATE_EPOCH``), so they all see one timeline.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

SCENARIO_ENV = "GPU_EXPORTER_SIMULATE_SCENARIO"  # path, or "" for the built-in scenario
EPOCH_ENV = "GPU_EXPORTER_SIMULATE_EPOCH"  # wall-clock seconds of t=0
PID_OFFSET_ENV = "GPU_EXPORTER_SIMULATE_PID_OFFSET"  # added to every simulated pid

_lock = threading.Lock()


def activate() -> None:
    """Hook ``import pynvml`` when the environment asks for a simulated node (else nothing)."""
    if SCENARIO_ENV not in os.environ:
        return
    if "pynvml" in sys.modules:
        patch(sys.modules["pynvml"])
    elif not any(isinstance(f, PynvmlFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, PynvmlFinder())


class PynvmlFinder(importlib.abc.MetaPathFinder):
    """Finds ``pynvml`` as the other finders do, and patches it once it has been executed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pynvml":
            return None
        sys.meta_path.remove(self)  # the real finders from here on
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = PatchingLoader(spec.loader)
        return spec


class PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        patch(module)


def patch(pynvml: Any) -> None:
    """Make pynvml's library loader install the simulated node instead of the real library."""
    original = pynvml._LoadNvmlLibrary

    def load_simulated_library() -> None:
        with _lock:
            if pynvml.nvmlLib is None:
                _install_node()
        if pynvml.nvmlLib is None:  # pragma: no cover - _install_node always sets it
            original()

    pynvml._LoadNvmlLibrary = load_simulated_library


def _install_node() -> None:
    from pathlib import Path

    from gpu_exporter.simulator import SimulatedNode, install, load_scenario

    path = Path(os.environ[SCENARIO_ENV]) if os.environ.get(SCENARIO_ENV) else None
    epoch = float(os.environ.get(EPOCH_ENV) or time.time())
    offset = int(os.environ.get(PID_OFFSET_ENV) or 0)
    node = SimulatedNode(
        load_scenario(path), clock=time.time, epoch=epoch, wall_origin=epoch, pid_offset=offset
    )
    install(node)
