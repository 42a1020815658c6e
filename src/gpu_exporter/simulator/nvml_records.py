"""What the simulated library's functions keep between calls (event sets, queued events, GPM
samples) and NVML's event constants: shared by ``node.py`` and the ``nvml_*`` function modules,
which must not import the node (it builds the library from them)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import pynvml

from gpu_exporter.simulator.devices import Device, GpuDevice

NO_INSTANCE = 0xFFFFFFFF
XID_EVENT = 0x8
SINGLE_BIT_ECC_EVENT = 0x1
DOUBLE_BIT_ECC_EVENT = 0x2


@dataclass(frozen=True)
class QueuedEvent:
    device: GpuDevice | None
    event_type: int
    data: int
    gpu_instance_id: int = NO_INSTANCE
    compute_instance_id: int = NO_INSTANCE
    lost: bool = False


class EventSet:
    """An NVML event set: registrations per GPU and a queue that wakes waiting threads."""

    def __init__(self) -> None:
        self.handle = pynvml.struct_c_nvmlEventSet_t()
        self.condition = threading.Condition()
        self.queue: deque[QueuedEvent] = deque()
        self.masks: dict[int, int] = {}
        self.freed = False

    def push(self, event: QueuedEvent) -> None:
        with self.condition:
            self.queue.append(event)
            self.condition.notify_all()


@dataclass
class GpmSample:
    """What a GPM sample buffer recorded: the device, the time and the activity integrals.

    One per buffer, from its allocation to its free, and written in place by each sample get,
    as the library fills the caller's buffer (``device`` None: never taken)."""

    device: Device | None = None
    t: float = 0.0
    integrals: Mapping[str, float] = field(default_factory=dict)
