"""Latest activity integrals per device, shared by the collectors with other consumers.

The activity and utilisation collectors record their ``_seconds_total`` integrals here after each
sample; allocation accounting reads them to tell idle from busy time without calling NVML.
``dcgm`` says which devices a DCGM host engine serves activity for, and holds its readings (the
DCGM service fills it; discovery, the activity collectors and through them idle accounting
read it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum

from .dcgm.readings import DcgmLink


class ActivityKind(Enum):
    SM_ACTIVE = "sm_active"  # GPM or DCGM: the honest measure
    UTILIZATION = "utilization"  # NVML's "a kernel was resident": the fallback


@dataclass(frozen=True)
class ActivityPoint:
    """``seconds_total`` is the integral of the activity ratio up to monotonic time ``at``."""

    at: float
    seconds_total: float


class ActivityLedger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._points: dict[tuple[str, ActivityKind], ActivityPoint] = {}
        self.dcgm = DcgmLink()

    def record(self, uuid: str, kind: ActivityKind, at: float, seconds_total: float) -> None:
        with self._lock:
            self._points[(uuid, kind)] = ActivityPoint(at, seconds_total)

    def latest(self, uuid: str, kind: ActivityKind) -> ActivityPoint | None:
        with self._lock:
            return self._points.get((uuid, kind))

    def forget(self, uuid: str) -> None:
        with self._lock:
            for key in [k for k in self._points if k[0] == uuid]:
                del self._points[key]
