"""Latest activity integrals per device, shared by the collectors with other consumers.

The activity and utilisation collectors record their ``_seconds_total`` integrals here after each
sample; allocation accounting reads them to tell idle from busy time without calling NVML.
``sm_band`` names the SM activity band of an interval's mean, for the per-device band counters
(and, over the same ledger intervals, a per-holder twin).
"""

from __future__ import annotations

import threading
from enum import Enum

# SM activity bands, by an interval's mean: below 10% idle-ish, above 50% a busy kernel stream.
SM_BANDS = ("low", "mid", "high")
LOW_BAND_BELOW, HIGH_BAND_ABOVE = 0.1, 0.5


def sm_band(ratio: float) -> int:
    """The index in ``SM_BANDS`` of an interval's mean SM activity ratio."""
    if ratio < LOW_BAND_BELOW:
        return 0
    return 1 if ratio <= HIGH_BAND_ABOVE else 2


class ActivityKind(Enum):
    SM_ACTIVE = "sm_active"  # GPM or DCGM: the honest measure
    UTILIZATION = "utilization"  # NVML's "a kernel was resident": the fallback


# (at, seconds_total): the integral of the activity ratio up to monotonic time ``at``. A plain
# tuple of floats, which the garbage collector untracks: one is replaced per device every round
# and kept by the readers until the next, where an instance would be promoted by every collection.
ActivityPoint = tuple[float, float]


def interval_between(
    previous: ActivityPoint, point: ActivityPoint
) -> tuple[float, float, float] | None:
    """(start, end, mean ratio) of the activity from ``previous`` to ``point``; None when
    ``point`` is not later (nothing new, a restarted collector) or its integral went back."""
    (start, total_then), (end, total_now) = previous, point
    gained = total_now - total_then
    if end <= start or gained < 0:
        return None
    return start, end, gained / (end - start)


class ActivityLedger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._points: dict[tuple[str, ActivityKind], ActivityPoint] = {}

    def record(self, uuid: str, kind: ActivityKind, at: float, seconds_total: float) -> None:
        with self._lock:
            self._points[(uuid, kind)] = (at, seconds_total)

    def latest(self, uuid: str, kind: ActivityKind) -> ActivityPoint | None:
        with self._lock:
            return self._points.get((uuid, kind))

    def forget(self, uuid: str) -> None:
        with self._lock:
            for key in [k for k in self._points if k[0] == uuid]:
                del self._points[key]
