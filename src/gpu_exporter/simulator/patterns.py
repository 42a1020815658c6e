"""Activity patterns and their exact time integrals.

Every pattern is piecewise linear in time, so the clamped sum of several patterns (time slicing on
one device) can be integrated exactly segment by segment. That exactness is the point: an exporter
that integrates GPM values must reproduce a scenario's mean activity to rounding error.

Values are ratios (0..1); the NVML layer converts to percent where NVML reports percent.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class Pattern(Protocol):
    """A periodic, piecewise-linear signal of time (seconds since its origin)."""

    def value(self, t: float) -> float: ...

    def breakpoints(self, a: float, b: float) -> list[float]:
        """Times in (a, b) where the slope or value may jump."""
        ...

    def busy(self) -> Pattern:
        """1 where this signal is above zero, else 0 (NVML's "a kernel was resident")."""
        ...

    def describe(self) -> dict[str, object]: ...


@dataclass(frozen=True)
class Steady:
    level: float

    def value(self, t: float) -> float:
        return self.level

    def breakpoints(self, a: float, b: float) -> list[float]:
        return []

    def busy(self) -> Pattern:
        return Steady(1.0 if self.level > 0 else 0.0)

    def describe(self) -> dict[str, object]:
        return {"pattern": "steady" if self.level else "idle", "value": self.level}


IDLE = Steady(0.0)


def _period_marks(a: float, b: float, period: float, offsets: Sequence[float]) -> list[float]:
    """All ``k*period + offset`` strictly inside (a, b)."""
    marks: list[float] = []
    for offset in offsets:
        # From one period before the first candidate, so rounding cannot skip one; each mark is
        # computed as k*period + offset and tested against (a, b) as it is.
        k = math.floor((a - offset) / period) - 1
        mark = k * period + offset
        while mark < b:
            if mark > a:
                marks.append(mark)
            k += 1
            mark = k * period + offset
    return marks


@dataclass(frozen=True)
class Bursty:
    """A square wave: ``high`` for ``duty`` of each ``period``, ``low`` for the rest."""

    high: float
    period: float
    duty: float
    low: float = 0.0

    def value(self, t: float) -> float:
        phase = t - math.floor(t / self.period) * self.period
        return self.high if phase < self.duty * self.period else self.low

    def breakpoints(self, a: float, b: float) -> list[float]:
        return _period_marks(a, b, self.period, (0.0, self.duty * self.period))

    def busy(self) -> Pattern:
        if self.low > 0:
            return Steady(1.0)
        if self.high <= 0:
            return IDLE
        return Bursty(1.0, self.period, self.duty, 0.0)

    def mean(self) -> float:
        return self.high * self.duty + self.low * (1 - self.duty)

    def describe(self) -> dict[str, object]:
        return {
            "pattern": "bursty",
            "value": self.high,
            "low": self.low,
            "period": self.period,
            "duty": self.duty,
        }


@dataclass(frozen=True)
class Ramp:
    """Linear from ``start`` to ``end`` over each ``period``, then back to ``start``."""

    start: float
    end: float
    period: float

    def value(self, t: float) -> float:
        phase = t - math.floor(t / self.period) * self.period
        return self.start + (self.end - self.start) * phase / self.period

    def breakpoints(self, a: float, b: float) -> list[float]:
        return _period_marks(a, b, self.period, (0.0,))

    def busy(self) -> Pattern:
        return Steady(1.0 if max(self.start, self.end) > 0 else 0.0)

    def mean(self) -> float:
        return (self.start + self.end) / 2

    def describe(self) -> dict[str, object]:
        return {"pattern": "ramp", "from": self.start, "to": self.end, "period": self.period}


@dataclass(frozen=True)
class Placed:
    """A pattern started at ``origin`` (absolute simulation time), scaled by ``weight``."""

    pattern: Pattern
    origin: float
    weight: float = 1.0

    def value(self, t: float) -> float:
        return self.weight * self.pattern.value(t - self.origin)

    def breakpoints(self, a: float, b: float) -> list[float]:
        origin = self.origin
        marks = self.pattern.breakpoints(a - origin, b - origin)
        return [m + origin for m in marks] if marks else marks


@dataclass(frozen=True)
class SegmentResult:
    """Integral of the clamped sum, and the time during which the sum was zero."""

    integral: float
    zero_time: float


def integrate(signals: Sequence[Placed], a: float, b: float, cap: float = 1.0) -> SegmentResult:
    """Exact integral over [a, b] of ``min(cap, sum(signals))`` and the time the sum is zero."""
    if b <= a:
        return SegmentResult(0.0, 0.0)
    if not signals:
        return SegmentResult(0.0, b - a)
    marks = _all_breakpoints(signals, a, b)
    if not marks:  # the usual read: one linear piece (patterns' periods are seconds or more)
        start, end = _line_ends(signals, a, b)
        zero = b - a if start <= 0 and end <= 0 else 0.0
        return SegmentResult(_clamped_area(start, end, b - a, cap), zero)
    cuts = sorted({a, b, *marks})
    integral = zero = 0.0
    for lo, hi in itertools.pairwise(cuts):
        start, end = _line_ends(signals, lo, hi)
        integral += _clamped_area(start, end, hi - lo, cap)
        if start <= 0 and end <= 0:
            zero += hi - lo
    return SegmentResult(integral, zero)


def _all_breakpoints(signals: Iterable[Placed], a: float, b: float) -> list[float]:
    marks: list[float] = []
    for signal in signals:
        marks += signal.breakpoints(a, b)
    return marks


def _line_ends(signals: Sequence[Placed], lo: float, hi: float) -> tuple[float, float]:
    """Values at both ends of a linear piece, read at interior points to dodge the jumps."""
    q1, q3 = lo + (hi - lo) / 4, lo + 3 * (hi - lo) / 4
    v1 = v3 = 0.0
    for signal in signals:
        v1 += signal.value(q1)
        v3 += signal.value(q3)
    slope = (v3 - v1) / (q3 - q1)
    return v1 - slope * (q1 - lo), v3 + slope * (hi - q3)


def _clamped_area(start: float, end: float, width: float, cap: float) -> float:
    """Area under min(cap, line) for a line from ``start`` to ``end`` over ``width``."""
    if start <= cap and end <= cap:
        return (start + end) / 2 * width
    if start >= cap and end >= cap:
        return cap * width
    cross = (cap - start) / (end - start) * width
    below_start, below_width = (start, cross) if start < cap else (end, width - cross)
    return (below_start + cap) / 2 * below_width + cap * (width - below_width)


def total_at(signals: Sequence[Placed], t: float, cap: float = 1.0) -> float:
    """The clamped sum of ``signals`` at time ``t``."""
    return min(cap, sum(s.value(t) for s in signals))
