"""A simulated NVIDIA node underneath the real ``pynvml`` module.

The simulator replaces ``libnvidia-ml.so`` only: :func:`install` puts a pure-Python object whose
attributes are NVML's C functions into ``pynvml.nvmlLib``, so pynvml's own wrappers (struct
versions, two-call size negotiation, error mapping) and all exporter code run unchanged.

Usage::

    scenario = load_scenario(path)            # None -> the built-in 8x H100 scenario
    node = SimulatedNode(scenario)            # t=0 now; clock injectable
    install(node)
    pynvml.nvmlInit()
    ...
    node.inject({"type": "xid", "gpu": 3, "code": 48})
    uninstall(); node.close()

Scenario schema (full reference with examples in ``docs/simulator.md``)::

    node:        {name, driver_version, cuda_version, boot_id, uptime, topology}  # all optional
    gpus:        - {model: H100-SXM-80GB, count: 8, mig: [3g.40gb, 1g.10gb], ecc: true}
    workloads:   - {gpu, mig, pod, namespace, container, pid, process_name, memory: 60GiB,
                    sm, tensor, dram, occupancy, utilization}
                   # activity: ratio 0..1 | "85%" | idle
                   #   | {pattern: steady, value} | {pattern: bursty, value, low, period, duty}
                   #   | {pattern: ramp, from, to, period}
    allocations: - {gpu, mig, replica, pod, namespace, container, resource, cpu_ids,
                    memory_numa_nodes}
    timeline:    - {at: 90s, repeat: every 10m, type: <event type>, ...}

Event types: xid, sxid, gpu_lost, gpu_recovered, throttle, ecc, row_remap, row_remap_failure,
retired_pages, recovery_action, allocate, release, workload_start,
workload_stop, hang, unhang. Models: see
``data/models.yaml``. Invalid input raises :class:`ScenarioError`:
``<file>: <key.path[2].sub>: <reason>``.
"""

from gpu_exporter.simulator.errors import ScenarioError
from gpu_exporter.simulator.install import install, uninstall
from gpu_exporter.simulator.loader import load_scenario, loads_scenario, parse_scenario
from gpu_exporter.simulator.node import Allocation, SimulatedNode
from gpu_exporter.simulator.scenario import Scenario

__all__ = [
    "Allocation",
    "Scenario",
    "ScenarioError",
    "SimulatedNode",
    "install",
    "load_scenario",
    "loads_scenario",
    "parse_scenario",
    "uninstall",
]
