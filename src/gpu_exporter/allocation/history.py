"""A short history of who held each device, so an event slightly in the past finds its holder.

Times are wall-clock seconds (events such as Xids carry wall times). A tenure starts when a poll
first sees the pod on the device and ends when a poll first misses it, so it may start up to one
poll interval late: a lookup that finds no tenure covering its time accepts one starting within
``slack`` after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..devices import DeviceId
from .model import PodKey


@dataclass
class Tenure:
    uuid: str
    parent_uuid: str | None
    pod: PodKey
    start: float
    end: float | None = None

    def covers(self, at: float, slack: float = 0.0) -> bool:
        return self.start - slack <= at and (self.end is None or at < self.end)

    def on(self, uuid: str) -> bool:
        return uuid in (self.uuid, self.parent_uuid)


class HolderHistory:
    def __init__(self, *, retention: float = 900.0, slack: float = 2.0, limit: int = 10_000):
        self._retention = retention
        self._slack = slack
        self._limit = limit  # bounds memory under heavy pod churn
        self._open: dict[tuple[str, PodKey], Tenure] = {}
        self._closed: list[Tenure] = []

    def observe(self, now: float, held: Mapping[DeviceId, Iterable[PodKey]]) -> None:
        """Record the holders a poll saw at wall time ``now``."""
        seen: set[tuple[str, PodKey]] = set()
        for device, pods in held.items():
            for pod in pods:
                key = (device.uuid, pod)
                seen.add(key)
                if key not in self._open:
                    self._open[key] = Tenure(device.uuid, device.parent_uuid, pod, now)
        for key in [k for k in self._open if k not in seen]:
            tenure = self._open.pop(key)
            tenure.end = now
            self._closed.append(tenure)
        self._prune(now)

    def holders(self, uuid: str, at: float) -> set[PodKey]:
        """Pods holding ``uuid`` (or, for a GPU in MIG mode, any of its instances) at ``at``."""
        tenures = [t for t in self._tenures() if t.on(uuid)]
        exact = {t.pod for t in tenures if t.covers(at)}
        if exact:
            return exact
        return {t.pod for t in tenures if t.covers(at, self._slack)}

    def _tenures(self) -> Iterable[Tenure]:
        yield from self._closed
        yield from self._open.values()

    def _prune(self, now: float) -> None:
        cutoff = now - self._retention
        if self._closed and (self._closed[0].end or now) < cutoff:
            self._closed = [t for t in self._closed if (t.end or now) >= cutoff]
        if len(self._closed) > self._limit:
            del self._closed[: len(self._closed) - self._limit]
