"""What the DCGM service hands the activity collectors: the latest records per NVML device.

A leaf module (it imports nothing of ours), so the collectors can depend on it without depending
on the connection machinery.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class FieldSample:
    """A field's latest record: engine timestamp (us since 1970) and value; None = no value."""

    ts_us: int
    value: float | None


@dataclass(frozen=True)
class DcgmSnapshot:
    """One device's records from the last read. ``generation`` changes with every new session
    (a reconnect re-creates the watches): timestamps of different generations are not
    compared."""

    generation: int
    fields: Mapping[int, FieldSample]


class DcgmReadings(Protocol):
    """Thread-safe: read by the activity collectors on worker threads."""

    def latest(self, uuid: str) -> DcgmSnapshot | None: ...


class DcgmLink:
    """What the sampler shares with the DCGM service: which devices DCGM serves (discovery puts
    that in each ``DeviceId``) and the readings its activity collectors take. Without
    ``--dcgm.address``/``--dcgm.embedded`` it stays empty and nothing is served."""

    def __init__(self) -> None:
        self.readings: DcgmReadings | None = None  # set once, before sampling starts
        self._served: frozenset[str] = frozenset()
        self._changed = False

    def __contains__(self, uuid: object) -> bool:
        return uuid in self._served

    def serve(self, uuids: Iterable[str]) -> None:
        """Record the devices DCGM serves now (after a (re)connect), on the event loop."""
        served = frozenset(uuids)
        if served != self._served:
            self._served = served  # one reference swap: readers on other threads see either
            self._changed = True

    def take_change(self) -> bool:
        """True once after the served devices changed: the sampler then rediscovers the GPUs
        (on the event loop, in its next fast round), so their DeviceIds, jobs and gpu_info
        follow."""
        changed, self._changed = self._changed, False
        return changed
