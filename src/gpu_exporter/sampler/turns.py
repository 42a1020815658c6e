"""Turns: while scrapers read the exposition, one worker at a time runs a round's jobs, resting
after each slice of CPU, so that the event loop answering the scrapers keeps most of the
interpreter.

CPython runs one thread's Python at a time. A round's jobs on the worker threads hold the GIL
for ~30 ms on ``mig56`` under scrape load (the simulator's NVML is Python too; a real driver's
calls release it). The event loop gives the GIL up at every socket call and gets it back only
when a worker drops it, at the latest after the switch interval (5 ms): with four workers
wanting it, the loop stood still for most of the round and every scrape in flight waited.
Taking turns bounds what the loop waits to a slice (0.5 ms of CPU, and the job that crosses it:
jobs take 0.03-0.24 ms at the median, 0.64 ms at most on ``mig56``), and the rest after each
slice, as long as the slice's CPU time (``share`` 0.5), hands the loop at least half the
interpreter while the round runs. Measured in docs/performance.md (interleaved cells, p99 at 8
scrapers: ``mig56`` gzip 2.2-2.7 -> 1.6-2.1 ms).

Rounds nobody reads (no scrape since the last round, the usual case between Prometheus's
scrapes) run as before: all workers at once, no rest. Two limits keep turns from costing data:
a turn held for ``max_turn`` seconds (a slow or hung NVML call: it holds no GIL while it waits
in the driver) no longer holds the others back, and the rest a round may take is bounded
(``begin_round``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Turn:
    """One worker's turn: it may run jobs until they have used a slice of its CPU."""

    __slots__ = ("started_cpu",)

    def __init__(self, started_cpu: float) -> None:
        self.started_cpu = started_cpu


class Turns:
    """One worker at a time, a rest after each slice; shared by the workers of the paced rounds."""

    def __init__(
        self,
        *,
        share: float = 0.5,
        slice_s: float = 0.0005,
        max_turn: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], not {share}")
        self._rest_per_cpu = 1 / share - 1
        self._slice = slice_s
        self._max_turn = max_turn
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._sleep = sleep
        self._cond = threading.Condition()
        self._holder: Turn | None = None  # whose turn it is; None: nobody's
        self._held_since = 0.0
        self._budget = 0.0

    def begin_round(self, rest_budget: float) -> None:
        """A paced round starts: its jobs may rest ``rest_budget`` seconds in all."""
        with self._cond:
            self._budget = rest_budget

    def next(self, turn: Turn | None) -> Turn:
        """The turn to run the next job in: ``turn`` while its jobs have used less than a slice
        of CPU; otherwise a new one, once ``turn`` has rested and handed on (resting per slice,
        not per job: a sleep and a wake-up cost ~30 us of CPU each on a VM)."""
        if turn is not None:
            if self._cpu_clock() - turn.started_cpu < self._slice:
                return turn
            self.end(turn)
        return self._take()

    def end(self, turn: Turn) -> None:
        """Rest in proportion to the CPU ``turn`` used, then hand the turn on."""
        rest = self._rest_s(self._cpu_clock() - turn.started_cpu)
        if rest > 0:
            self._sleep(rest)
        with self._cond:
            if self._holder is turn:  # not if this turn overran and another worker took one
                self._holder = None
                self._cond.notify()

    def _take(self) -> Turn:
        with self._cond:
            while self._holder is not None:
                overrun_in = self._held_since + self._max_turn - self._clock()
                if overrun_in <= 0:
                    break  # a slow or hung call, holding no GIL: go ahead of it
                self._cond.wait(overrun_in)
            turn = self._holder = Turn(self._cpu_clock())
            self._held_since = self._clock()
            return turn

    def _rest_s(self, cpu_s: float) -> float:
        with self._cond:
            rest = min(cpu_s * self._rest_per_cpu, self._budget)
            self._budget -= rest
            return rest
