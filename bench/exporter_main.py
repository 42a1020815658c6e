"""The exporter's own entry point (``gpu_exporter.cli.main``) with the simulator's CPU metered.

``python bench/exporter_main.py <gpu-exporter flags>`` runs exactly what ``python -m gpu_exporter``
runs, except that the fake ``libnvidia-ml`` installed under ``--simulate`` has each of its C entry
points wrapped to add the thread CPU time spent inside the simulator to a counter (see
``sampler_cost.SimMeter``; about 1 us per NVML call). On SIGUSR1 the process writes
``{"seq", "sim_cpu_ns", "sim_calls"}`` to the file named by ``BENCH_SIM_METER``, so the harness can
subtract the simulator's share from the process's /proc CPU time.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sampler_cost import SimMeter

import gpu_exporter.simulator as simulator
from gpu_exporter.cli import main

_meters: list[SimMeter] = []
_seq = 0
_original_install = simulator.install


def _metered_install(node: Any) -> None:
    _meters.append(SimMeter(node.library))
    _original_install(node)


def _dump(signum: int, frame: object) -> None:
    global _seq
    _seq += 1
    target = os.environ.get("BENCH_SIM_METER")
    if not target:
        return
    data = {
        "seq": _seq,
        "sim_cpu_ns": sum(m.ns for m in _meters),
        "sim_calls": sum(m.calls for m in _meters),
    }
    tmp = f"{target}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, target)


if __name__ == "__main__":
    simulator.install = _metered_install  # app._start_simulation imports it at call time
    signal.signal(signal.SIGUSR1, _dump)
    main()
