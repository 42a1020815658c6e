"""One device's ``nvmlGpmMetricsGet`` request, built once and reused every round.

The request struct holds NVML_GPM_METRIC_MAX metric slots (about 4 KiB); building it, setting the
metric ids and reading each answer back through pynvml's struct wrappers (a Python-level
``__getattribute__`` per member) cost more than the rest of the activity collector. The request
is kept, its ids are set only when they change, and the answers are unpacked from the array's
bytes at once, as the field values are (``nvml/calls.py``); the layout is checked against ctypes
first, and a pynvml whose struct differs is read member by member.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import pynvml

from ..nvml import DeviceCalls

# c_nvmlGpmMetric_t as bytes: metricId, nvmlReturn, value, then metricInfo's three pointers.
_METRIC_LAYOUT = struct.Struct("=IId24x")


def _layout_matches() -> bool:
    metric = pynvml.c_nvmlGpmMetric_t
    return (
        ctypes.sizeof(metric) == _METRIC_LAYOUT.size
        and (metric.metricId.offset, metric.nvmlReturn.offset, metric.value.offset) == (0, 4, 8)
        and ctypes.sizeof(pynvml._nvmlReturn_t) == 4
    )


class GpmRequest:
    """Metric ids asked of two GPM samples; :meth:`get` answers ``(id, nvmlReturn, value)``."""

    def __init__(self, metric_ids: Sequence[int]) -> None:
        self._request = pynvml.c_nvmlGpmMetricsGet_t()
        self._request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        self._ids: tuple[int, ...] = ()
        self._unpack = _layout_matches()
        self.set_ids(metric_ids)

    @property
    def ids(self) -> tuple[int, ...]:
        return self._ids

    def set_ids(self, metric_ids: Sequence[int]) -> None:
        self._ids = tuple(metric_ids)
        self._request.numMetrics = len(self._ids)
        for slot, metric_id in enumerate(self._ids):
            self._request.metrics[slot].metricId = metric_id

    def get(
        self, calls: DeviceCalls, sample1: Any, sample2: Any
    ) -> Iterator[tuple[int, int, float]] | None:
        """The means between ``sample1`` and ``sample2``; None when the call failed."""
        request = self._request
        request.sample1 = sample1
        request.sample2 = sample2
        if calls.get(pynvml.nvmlGpmMetricsGet, request) is None:
            return None
        return self._answers()

    def _answers(self) -> Iterator[tuple[int, int, float]]:
        count = len(self._ids)
        if not self._unpack:
            for slot in range(count):
                metric = self._request.metrics[slot]
                yield int(metric.metricId), int(metric.nvmlReturn), float(metric.value)
            return
        raw = ctypes.string_at(ctypes.addressof(self._request.metrics), count * _METRIC_LAYOUT.size)
        yield from _METRIC_LAYOUT.iter_unpack(raw)
