"""Batched field reads: one ``nvmlDeviceGetFieldValues`` call per device per round.

Several collectors read NVML field values (memory temperature, clock-event counters, the recovery
action, energy, NVLink and PCIe counters). Each registers the fields it wants with its device's
:class:`FieldBatch` for its cadence; the first collector of a round to read the batch asks NVML
for the union in one call, and the device's other collectors of that round reuse the answer.
Collectors of one device run concurrently on worker threads, so the batch is guarded by a lock;
"one round" is recognised by time and by who asks: an answer is reused while it is younger than
:data:`FRESH_FOR` seconds (and than half the cadence's interval) and the collector asking has not
had it yet; a collector asking a second time has started its next round.

A fast round therefore costs one field call per device however many signals come from fields,
and adding a field-backed signal costs no NVML call at all (docs/performance.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..nvml import DeviceCalls
from ..nvml.calls import FieldKey, FieldRequest, field_signal

# Jobs of one round start within milliseconds of each other; rounds are >= 0.5 s apart.
FRESH_FOR = 0.25


class FieldBatch:
    """The fields one device's collectors of one cadence want, read together."""

    def __init__(self, clock: Callable[[], float], interval: float = 1.0) -> None:
        self._clock = clock
        self._fresh_for = min(FRESH_FOR, interval / 2)
        self._lock = threading.Lock()
        self._wanted: dict[FieldKey, None] = {}  # insertion-ordered set
        # The last answers are held until the next round as numbers and value types: dicts of
        # ints and floats, which the garbage collector does not track (FieldValue tuples it
        # would, and would promote to its old generation each time a collection finds them).
        self._numbers: Mapping[FieldKey, float] = {}
        self._value_types: Mapping[FieldKey, int] = {}
        self._request: FieldRequest | None = None  # the wanted fields' array, reused
        self._read_at: float | None = None
        self._grown = False  # fields were added since the last read
        self._served: set[str] = set()  # collectors (DeviceCalls.collector) given this answer

    def want(self, keys: Iterable[FieldKey]) -> None:
        """Add fields to the batch (from a collector's constructor or its first round)."""
        with self._lock:
            for key in keys:
                if key not in self._wanted:
                    self._wanted[key] = None
                    self._grown = True

    def read(self, calls: DeviceCalls, handle: Any) -> Mapping[FieldKey, float]:
        """This round's values of every wanted field the device answered, as numbers."""
        with self._lock:
            self._refresh(calls, handle)
            return self._numbers

    def read_with_types(
        self, calls: DeviceCalls, handle: Any
    ) -> tuple[Mapping[FieldKey, float], Mapping[FieldKey, int]]:
        """This round's numbers, and the ``nvmlValueType_t`` each answered field came as."""
        with self._lock:
            self._refresh(calls, handle)
            return self._numbers, self._value_types

    def _refresh(self, calls: DeviceCalls, handle: Any) -> None:
        """Ask NVML unless this round already did (and no field was added since)."""
        now = self._clock()
        fresh = self._read_at is not None and 0 <= now - self._read_at < self._fresh_for
        if fresh and not self._grown and calls.collector not in self._served:
            self._served.add(calls.collector)
            return
        if self._grown or self._request is None:
            self._request = FieldRequest(tuple(self._wanted))
        self._grown = False
        self._served.clear()  # the same set every round: a new one would be a tracked object
        self._served.add(calls.collector)
        answers = calls.field_values(handle, self._request)
        self._numbers = {key: answer.value for key, answer in answers.items()}
        self._value_types = {key: answer.value_type for key, answer in answers.items()}
        self._read_at = self._clock()
        if len(answers) < len(self._wanted):
            self._prune(calls)

    def _prune(self, calls: DeviceCalls) -> None:
        """Forget fields the device lacks, so later rounds do not even filter them out."""
        for key in [k for k in self._wanted if calls.lacks(field_signal(k))]:
            del self._wanted[key]
            self._request = None

    @property
    def wanted(self) -> tuple[FieldKey, ...]:
        with self._lock:
            return tuple(self._wanted)


class FieldBatches:
    """Every device's batches, keyed by (device UUID, cadence name); shared by all collectors."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._batches: dict[tuple[str, str], FieldBatch] = {}

    def batch(self, uuid: str, cadence: str, interval: float) -> FieldBatch:
        with self._lock:
            key = (uuid, cadence)
            if key not in self._batches:
                self._batches[key] = FieldBatch(self._clock, interval)
            return self._batches[key]
