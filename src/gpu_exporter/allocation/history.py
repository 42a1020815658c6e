"""A short history of who held each device, so an event slightly in the past finds its holder.

Times are wall-clock seconds (events such as Xids carry wall times). A tenure starts when a poll
first sees the pod on the device and ends when a poll first misses it, so it may start up to one
poll interval late: a lookup that finds no tenure covering its time accepts one starting within
``slack`` after it.

What other threads read is a :class:`HolderSnapshot`: the history and the PIDs seen in pods,
frozen when they change (the Xid reader threads attribute an Xid with it, never waiting on the
event loop that changes the history).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..devices import DeviceId
from .model import PodKey


@dataclass(frozen=True)
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

    def observe(self, now: float, held: Mapping[DeviceId, Iterable[PodKey]]) -> bool:
        """Record the holders a poll saw at wall time ``now``; whether the history changed."""
        seen: set[tuple[str, PodKey]] = set()
        opened = False
        for device, pods in held.items():
            for pod in pods:
                key = (device.uuid, pod)
                seen.add(key)
                if key not in self._open:
                    self._open[key] = Tenure(device.uuid, device.parent_uuid, pod, now)
                    opened = True
        ended = [k for k in self._open if k not in seen]
        for key in ended:
            self._closed.append(dataclasses.replace(self._open.pop(key), end=now))
        pruned = self._prune(now)
        return opened or bool(ended) or pruned

    def snapshot(self, by_pid: Mapping[int, PodKey] | None = None) -> HolderSnapshot:
        """The history as it is now, with the pod of each PID seen in one."""
        return HolderSnapshot(
            (*self._closed, *self._open.values()),
            MappingProxyType(dict(by_pid or {})),
            self._slack,
        )

    def _prune(self, now: float) -> bool:
        before = len(self._closed)
        cutoff = now - self._retention
        if self._closed and (self._closed[0].end or now) < cutoff:
            self._closed = [t for t in self._closed if (t.end or now) >= cutoff]
        if len(self._closed) > self._limit:
            del self._closed[: len(self._closed) - self._limit]
        return len(self._closed) != before


@dataclass(frozen=True)
class HolderSnapshot:
    """Who held which device, and which pod each PID ran in, frozen at one moment: safe to read
    on any thread (the Xid subsystem's ``HolderLookup``)."""

    tenures: tuple[Tenure, ...] = ()
    by_pid: Mapping[int, PodKey] = field(default_factory=lambda: MappingProxyType({}))
    slack: float = 0.0

    def holder(self, uuid: str, at_wall_time: float, pid: int | None = None) -> PodKey | None:
        """(namespace, pod) that held ``uuid`` at ``at_wall_time``; None if none or ambiguous.

        A PID seen in a pod wins (it singles out one pod of a time-sliced device); otherwise the
        history must name exactly one pod. ``uuid`` may be a GPU in MIG mode: then any of its
        instances' holders count.
        """
        if pid is not None:
            pod = self.by_pid.get(pid)
            if pod is not None:
                return pod
        pods = self.pods(uuid, at_wall_time)
        return next(iter(pods)) if len(pods) == 1 else None

    def pods(self, uuid: str, at: float) -> set[PodKey]:
        """Pods holding ``uuid`` (or, for a GPU in MIG mode, any of its instances) at ``at``."""
        tenures = [t for t in self.tenures if t.on(uuid)]
        exact = {t.pod for t in tenures if t.covers(at)}
        if exact:
            return exact
        return {t.pod for t in tenures if t.covers(at, self.slack)}
