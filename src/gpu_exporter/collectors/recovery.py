"""The driver's recommended recovery action (NVML field 230, newer drivers): one series per GPU,
the current action as its label. The actions exclude each other, so a state set's four other
series would always read 0 (docs/migration.md); ``gpu_recovery_action{action!="none"}`` is a GPU
that needs recovering."""

from __future__ import annotations

from ..devices import Device
from ..exposition import gauge, label_string
from ..nvml import DeviceCalls
from .base import Cadence, Collector, CollectorContext, SampleWriter

RECOVERY_ACTION = gauge(
    "gpu_recovery_action",
    "The driver's recommended recovery action, as the action label (none, gpu_reset, "
    "node_reboot, drain_p2p, drain_and_reset; unknown for a code this exporter does not know): "
    "always 1.",
)
FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
ACTIONS = tuple(
    label_string({"action": name})
    for name in ("none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset")
)
UNKNOWN_ACTION = label_string({"action": "unknown"})


class RecoveryCollector(Collector):
    name = "recovery"
    help = "The driver's GPU recovery action (none, gpu_reset, node_reboot, drain_p2p, ...)."
    cadence = Cadence.FAST
    families = (RECOVERY_ACTION,)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._fields = context.field_batch(device, self.cadence)
        self._fields.want((FIELD_RECOVERY_ACTION,))

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        value = self._fields.read(calls, self.device.handle).get(FIELD_RECOVERY_ACTION)
        if value is None:
            return
        code = int(value)
        out.add(RECOVERY_ACTION, 1.0, ACTIONS[code] if 0 <= code < len(ACTIONS) else UNKNOWN_ACTION)
