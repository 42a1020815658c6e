"""The NVLink domain a GPU belongs to, and whether its fabric is healthy (NVSwitch / NVL systems).

``nvmlDeviceGetGpuFabricInfoV`` with the v3 struct gives the cluster UUID, the clique id, the
state (not started / in progress / completed), the health mask and (v3) a health summary; older
drivers answer only ``nvmlDeviceGetGpuFabricInfo`` (v1: no health). The GPUs of one clique form
one NVLink domain, the unit a job that needs a whole domain is scheduled on. A GPU without a
fabric (PCIe cards, A100 without NVSwitch) answers NotSupported or state "not supported", and has
no fabric series. HGX boards report a zero cluster UUID: their domain is the node (the recording
rules in alerts/recording_rules.yml group those by instance), so such a GPU's info series would
say only what ``gpu_fabric_healthy`` says; it is served while the fabric is not completed, naming
the state (docs/migration.md).
"""

from __future__ import annotations

import uuid
from typing import Any

import pynvml

from ..exposition import gauge, label_string
from ..nvml import DeviceCalls
from .base import Cadence, Collector, SampleWriter

FABRIC_INFO = gauge(
    "gpu_fabric_info",
    "The GPU's NVLink fabric: cluster UUID, clique (one clique is one NVLink domain), state; 1."
    " A GPU with a zero cluster UUID (HGX: the node is its domain) has it while not completed.",
)
ZERO_CLUSTER = str(uuid.UUID(int=0))
FABRIC_HEALTHY = gauge(
    "gpu_fabric_healthy",
    "1 when the fabric finished initialising and reports no degradation, else 0.",
)
STATES = {
    pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not_started",
    pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in_progress",
    pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "completed",
}
UNHEALTHY_SUMMARIES = frozenset(
    {
        pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
        pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY,
    }
)
_DEGRADED_BW_MASK = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW << (
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
)
_DEGRADED_BW_TRUE = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE << (
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
)


def read_fabric(calls: DeviceCalls, handle: Any) -> tuple[Any, bool] | None:
    """The fabric struct (v3, else v1) and whether it has health fields; None without a fabric."""
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    if calls.get(pynvml.nvmlDeviceGetGpuFabricInfoV, handle, info, signal="fabric_v3") is not None:
        return info, True
    if not calls.lacks("fabric_v3"):
        return None  # failed this round (counted): try again next round
    legacy = pynvml.c_nvmlGpuFabricInfo_t()
    if calls.get(pynvml.nvmlDeviceGetGpuFabricInfo, handle, legacy, signal="fabric_v1") is None:
        return None
    return legacy, False


def fabric_healthy(info: Any, has_health: bool) -> bool:
    if int(info.state) != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
        return False
    if int(info.status) != pynvml.NVML_SUCCESS:
        return False
    if not has_health:
        return True
    if (int(info.healthMask) & _DEGRADED_BW_MASK) == _DEGRADED_BW_TRUE:
        return False
    return int(info.healthSummary) not in UNHEALTHY_SUMMARIES


class FabricCollector(Collector):
    name = "fabric"
    help = "NVLink domain (fabric cluster UUID, clique, state) and fabric health (slow cadence)."
    cadence = Cadence.SLOW
    families = (FABRIC_INFO, FABRIC_HEALTHY)

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        read = read_fabric(calls, self.device.handle)
        if read is None:
            return
        info, has_health = read
        state = STATES.get(int(info.state))
        if state is None:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: no fabric on this GPU
            return
        cluster = str(uuid.UUID(bytes=bytes(info.clusterUuid)))
        if cluster != ZERO_CLUSTER or state != "completed":
            labels = label_string(
                {"cluster_uuid": cluster, "clique_id": str(int(info.cliqueId)), "state": state}
            )
            out.add(FABRIC_INFO, 1.0, labels)
        out.add(FABRIC_HEALTHY, 1.0 if fabric_healthy(info, has_health) else 0.0)
