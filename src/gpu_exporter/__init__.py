"""gpu-exporter: a node agent that tells GPU fleet operators what their GPUs really do.

Where things live (docs/design.md has the full map, one line per module):

Core (no network, no CLI; may not import the edge):
    settings, config   every flag declared once; the frozen Config
    nvml/              the NVML boundary: calls, error mapping, worker pool
    devices, ledger    discovery and device identity; activity integrals shared by consumers
    collectors/        one module per signal family (node_exporter's collector pattern)
    sampler            rounds, GPU liveness, self-metrics, rendering the exposition
    exposition, identity, logs   families and cached bytes; gpu_info/build_info; structured logs
    xid/               Xid and SXid ingest (kernel log, NVML events), journal, metrics
    allocation/        kubelet pod-resources, processes and cgroups, idle accounting

Edge (what reaches or is reached from outside):
    http/              every endpoint: server, guard, web config and its reloads, admin API
    cli, app           flags into Config (the only module that exits); wiring the parts
    simulator/         stands in for libnvidia-ml, the kubelet and the kernel log (--simulate)
    simulate_cli, simulate_hook   gpu-exporter-simulate: the simulated node under any program
"""

__version__ = "0.1.0"
