"""A JSON-ready picture of the simulated node (for ``GET /-/simulator/scenario``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpu_exporter.simulator.devices import GpuDevice, MigDevice, Workload

if TYPE_CHECKING:
    from gpu_exporter.simulator.node import SimulatedNode


def current_summary(node: SimulatedNode) -> dict[str, Any]:
    """The node's current state, JSON-ready (events due applied, counters integrated)."""
    with node.lock:
        t = node.advance()
        upcoming = [(at, e.raw) for at, e in node.timeline.upcoming(20)]
        return node_summary(node, t, upcoming)


def node_summary(
    node: SimulatedNode, t: float, upcoming: Sequence[tuple[float, Mapping[str, Any]]]
) -> dict[str, Any]:
    spec = node.scenario.node
    return {
        "source": node.scenario.source,
        "time_s": round(t, 3),
        "node": {
            "name": spec.name,
            "driver_version": spec.driver_version,
            "cuda_version": spec.cuda_version,
            "boot_id": spec.boot_id,
        },
        "gpus": [_gpu(gpu, t) for gpu in node.gpus],
        "allocations": [
            {
                "gpu": a.spec.gpu,
                "mig": a.spec.mig,
                "device_id": a.device_id,
                "namespace": a.spec.namespace,
                "pod": a.spec.pod,
                "container": a.spec.container,
                "resource": a.spec.resource,
            }
            for a in node.allocations
        ],
        "hangs": [{"function": h.function, "gpu": h.gpu} for h in node.hangs],
        "kmsg_records": len(node.kmsg_lines),
        "recent_events": list(node.applied)[-20:],
        "upcoming_events": [{"at": round(at, 3), **raw} for at, raw in upcoming],
    }


def _gpu(gpu: GpuDevice, t: float) -> dict[str, Any]:
    errors = gpu.errors
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "model": gpu.model.key,
        "pci_bus_id": gpu.bus_id,
        "lost": gpu.lost,
        "mig_enabled": gpu.mig_enabled,
        "ecc_enabled": gpu.spec.ecc,
        "throttles": sorted(gpu.throttles),
        "power_w": round(gpu.power_w(t), 1),
        "sm_active": round(gpu.activity_now("sm", t), 4),
        "memory_used_bytes": gpu.memory_used(),
        "ecc": {"volatile": errors.ecc_volatile, "aggregate": errors.ecc_aggregate},
        "remapped_rows": errors.remapped,
        "row_remap_pending": errors.remap_pending,
        "row_remap_failed": errors.remap_failure,
        "retired_pages": len(errors.retired),
        "recovery_action": gpu.recovery_action,
        "workloads": [_workload(w) for w in gpu.workloads],
        "mig": [_mig(m) for m in gpu.migs],
    }


def _mig(mig: MigDevice) -> dict[str, Any]:
    return {
        "index": mig.spec.index,
        "uuid": mig.uuid,
        "profile": mig.spec.profile.name,
        "gpu_instance_id": mig.spec.gpu_instance_id,
        "workloads": [_workload(w) for w in mig.workloads],
    }


def _workload(w: Workload) -> dict[str, Any]:
    spec = w.spec
    return {
        "pid": w.pid,
        "namespace": spec.namespace,
        "pod": spec.pod,
        "container": spec.container,
        "memory_bytes": spec.memory,
        "sm": spec.sm.describe(),
        "tensor": spec.tensor.describe(),
        "dram": spec.dram.describe(),
    }
