"""The driver's recommended recovery action (NVML field 230, newer drivers), as a state set."""

from __future__ import annotations

from ..devices import Device
from ..exposition import gauge, label_string
from ..nvml import DeviceCalls
from .base import Cadence, Collector, CollectorContext, SampleWriter

RECOVERY_ACTION = gauge(
    "gpu_recovery_action",
    "The driver's recommended recovery action: 1 for the current action, 0 for the others.",
)
FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
ACTIONS = tuple(
    (code, label_string({"action": name}))
    for code, name in enumerate(
        ("none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset")
    )
)


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
        for code, labels in ACTIONS:
            out.add(RECOVERY_ACTION, 1.0 if int(value) == code else 0.0, labels)
