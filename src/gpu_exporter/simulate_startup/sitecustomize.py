"""Run at interpreter start-up under ``gpu-exporter-simulate`` (this directory is on PYTHONPATH).

It hooks ``import pynvml`` to the simulated node (gpu_exporter.simulate_hook), then runs the
``sitecustomize`` this file shadows, if there is one. An interpreter that cannot import
gpu_exporter itself gets the command's package directory at the end of its path.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _start() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from gpu_exporter import simulate_hook as preload
    except ImportError:
        fallback = os.environ.get("GPU_EXPORTER_SIMULATE_PACKAGES", "")
        if not fallback:
            raise
        sys.path.append(fallback)
        from gpu_exporter import simulate_hook as preload
    preload.activate()
    # The sitecustomize further down the path (a distribution's own) still runs: found and run
    # by path, so neither sys.path nor sys.modules is changed for it.
    shadowed = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", shadowed)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


try:
    _start()
except Exception as error:
    sys.stderr.write(f"gpu-exporter-simulate: no simulated GPUs in this process: {error!r}\n")
