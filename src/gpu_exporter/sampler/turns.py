"""Turns: while scrapers read the exposition, a round's jobs run one at a time and rest between
jobs, so that the event loop answering them keeps most of the interpreter.

CPython runs one thread's Python at a time. A round's jobs on the worker threads hold the GIL
for ~30 ms on ``mig56`` under scrape load (the simulator's NVML is Python too; a real driver's
calls release it). The event loop gives the GIL up at every socket call and gets it back only
when a worker drops it, at the latest after the switch interval (5 ms): with four workers
wanting it, the loop stood still for most of the round and every scrape in flight waited.
Taking turns bounds what the loop waits to one job (median 0.07 ms, the longest 0.6 ms on
``mig56``), and the rest after each job, as long as the job's own CPU time (``share`` 0.5),
hands the loop at least half the interpreter while the round runs. Measured in
docs/performance.md (interleaved cells, p99 at 8 scrapers: ``mig56`` gzip 2.7 -> 1.8 ms).

Rounds nobody reads (no scrape since the last round, the usual case between Prometheus's
scrapes) run as before: all workers at once, no rest. Two limits keep turns from costing data:
a job that has run for ``max_turn`` seconds (a slow or hung NVML call: it holds no GIL while it
waits in the driver) no longer holds the others back, and the rest a round may take is bounded
(``begin_round``), so a paced round ends as far ahead of its deadline as an unpaced one, give or
take that budget.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Turns:
    """One job at a time, a rest after each; shared by the worker threads of the paced rounds."""

    def __init__(
        self,
        *,
        share: float = 0.5,
        max_turn: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], not {share}")
        self._rest_per_cpu = 1 / share - 1
        self._max_turn = max_turn
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._sleep = sleep
        self._cond = threading.Condition()
        self._holder: object | None = None  # the running job's token; None: nobody's turn
        self._held_since = 0.0
        self._budget = 0.0

    def begin_round(self, rest_budget: float) -> None:
        """A paced round starts: its jobs may rest ``rest_budget`` seconds in all."""
        with self._cond:
            self._budget = rest_budget

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Wait for this job's turn, run it, rest in proportion to the CPU it used, then hand the
        turn on (resting before handing it on wakes the next job once, not twice)."""
        token = self._take()
        started = self._cpu_clock()
        try:
            yield
        finally:
            rest = self._rest_s(self._cpu_clock() - started)
            if rest > 0:
                self._sleep(rest)
            self._give_back(token)

    def _take(self) -> object:
        with self._cond:
            while self._holder is not None:
                overrun_in = self._held_since + self._max_turn - self._clock()
                if overrun_in <= 0:
                    break  # a slow or hung call, holding no GIL: go ahead of it
                self._cond.wait(overrun_in)
            token = self._holder = object()
            self._held_since = self._clock()
            return token

    def _rest_s(self, cpu_s: float) -> float:
        with self._cond:
            rest = min(cpu_s * self._rest_per_cpu, self._budget)
            self._budget -= rest
            return rest

    def _give_back(self, token: object) -> None:
        with self._cond:
            if self._holder is token:  # not if this job overran its turn and another took it
                self._holder = None
                self._cond.notify()
