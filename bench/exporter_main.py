"""The exporter's own entry point (``gpu_exporter.cli.main``) with the simulator's CPU metered.

``python bench/exporter_main.py <gpu-exporter flags>`` runs exactly what ``python -m gpu_exporter``
runs, except that the fake ``libnvidia-ml`` installed under ``--simulate`` has each of its C entry
points wrapped to add the thread CPU time spent inside the simulator to a counter (see
``simmeter.SimMeter``; about 1 us per NVML call). On SIGUSR1 the process writes
``{"seq", "sim_cpu_ns", "sim_calls"}`` to the file named by ``BENCH_SIM_METER``, so the harness can
subtract the simulator's share from the process's /proc CPU time. The simulated kubelet's own work
(its answers, its /proc and pod-log trees) is metered as simulator too (``simmeter.meter_kubelet``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from typing import Any

from simmeter import install_dump, meter_kubelet, metered_install

from gpu_exporter import cli


def _metered_host(original: Any) -> Any:
    """``simulator.host.simulated_host`` with its kubelet metered."""

    def build(config: Any) -> Any:
        simulated = original(config)
        meter_kubelet(simulated.kubelet)
        return simulated

    return build


if __name__ == "__main__":
    import gpu_exporter.simulator.host as host

    host.install = metered_install(host.install)  # the simulated host installs its node with it
    host.simulated_host = _metered_host(host.simulated_host)  # the CLI imports it at call time
    install_dump()
    cli.main()
