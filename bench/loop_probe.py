"""The exporter with a loop-lag probe on its event loop: how long the loop stood still.

``python bench/loop_probe.py <gpu-exporter flags>`` runs exactly what ``python -m gpu_exporter``
runs (``gpu_exporter.cli.main``), with one task more on the same event loop: it sleeps 10 ms
again and again and records how late each wake-up was. A wake-up is late by as long as the loop
was busy elsewhere (a callback that ran long, the loop thread waiting for the GIL) when the
timer fell due, which is what a request arriving at that moment waits before the loop reads it;
so the distribution of lateness is the distribution of what a scrape or a probe meets.

The probe is installed from outside the product: an event-loop policy whose first new loop
schedules it, before the CLI's ``asyncio.run`` runs anything on that loop. Production code has
no hook for it. Each SIGUSR2 writes the lateness since the previous one (or since the start) as
JSON to ``$BENCH_LOOP_LAG`` (atomically, with a sequence number) and starts a new distribution;
the last one is written when the loop shuts down. The bench sends one after the warm-up, to
discard the start, and one at the end of its window.

The lateness is kept as a histogram of 0.1 ms buckets (a few hundred integers at most), so the
probe adds nothing measurable to the process's memory; its CPU (100 wake-ups a second) is why
the bench runs it in a process of its own, never in the one whose CPU and RSS it reports.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

LAG_ENV = "BENCH_LOOP_LAG"
INTERVAL_S = 0.010
RESOLUTION_MS = 0.1
AT_LEAST_MS = (1.0, 5.0, 10.0, 20.0)  # reported as counts of wake-ups at least this late


class LagHistogram:
    """Lateness of timer wake-ups, in buckets of ``resolution_ms``; the maximum is exact."""

    def __init__(self, resolution_ms: float = RESOLUTION_MS) -> None:
        self.resolution_ms = resolution_ms
        self.counts: dict[int, int] = {}
        self.count = 0
        self.total_ms = 0.0
        self.max_ms = 0.0

    def record(self, late_s: float) -> None:
        """One wake-up ``late_s`` seconds after it fell due (early counts as on time: the
        loop runs a timer that falls due within its clock's resolution)."""
        late_ms = max(0.0, late_s * 1000)
        bucket = int(late_ms / self.resolution_ms)
        self.counts[bucket] = self.counts.get(bucket, 0) + 1
        self.count += 1
        self.total_ms += late_ms
        self.max_ms = max(self.max_ms, late_ms)

    def percentile(self, q: float) -> float | None:
        """The lateness that ``q`` % of wake-ups did not exceed: the upper edge of the bucket
        holding that rank (never above the exact maximum); None with no wake-up."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q / 100 * self.count))
        seen = 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen >= rank:
                return min((bucket + 1) * self.resolution_ms, self.max_ms)
        return self.max_ms

    def at_least(self, threshold_ms: float) -> int:
        """Wake-ups at least ``threshold_ms`` late (to the buckets' resolution)."""
        first = math.ceil(threshold_ms / self.resolution_ms - 1e-9)
        return sum(n for bucket, n in self.counts.items() if bucket >= first)

    def summary(self, interval_s: float = INTERVAL_S) -> dict[str, Any]:
        return {
            "interval_ms": interval_s * 1000,
            "resolution_ms": self.resolution_ms,
            "wakeups": self.count,
            "p50_ms": _rounded(self.percentile(50)),
            "p99_ms": _rounded(self.percentile(99)),
            "max_ms": _rounded(self.max_ms) if self.count else None,
            "mean_ms": _rounded(self.total_ms / self.count) if self.count else None,
            "at_least_ms": {f"{t:g}": self.at_least(t) for t in AT_LEAST_MS},
        }


def _rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 3)


class Probe:
    """Sleeps ``interval_s`` on the running loop, forever, recording each wake-up's lateness."""

    def __init__(self, target: Path | None, interval_s: float = INTERVAL_S) -> None:
        self.target = target
        self.interval_s = interval_s
        self.histogram = LagHistogram()
        self.seq = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                due = loop.time() + self.interval_s
                await asyncio.sleep(self.interval_s)
                self.histogram.record(loop.time() - due)
        finally:
            self.dump()

    def dump(self) -> None:
        """Write the distribution since the last dump and start a new one."""
        self.seq += 1
        data = {"seq": self.seq, **self.histogram.summary(self.interval_s)}
        self.histogram = LagHistogram(self.histogram.resolution_ms)
        if self.target is not None:
            tmp = self.target.with_name(self.target.name + ".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.target)


class ProbedLoopPolicy(asyncio.DefaultEventLoopPolicy):
    """The default policy, except that the first loop it makes starts ``start`` on itself.

    ``asyncio.run`` asks the policy for its loop up to Python 3.15; where policies are gone
    (3.16), the same start belongs in a ``loop_factory``, which would need the CLI to take one."""

    def __init__(self, start: Callable[[asyncio.AbstractEventLoop], None]) -> None:
        super().__init__()
        self._start: Callable[[asyncio.AbstractEventLoop], None] | None = start

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop = super().new_event_loop()
        start, self._start = self._start, None
        if start is not None:
            loop.call_soon(start, loop)
        return loop


def install(probe: Probe) -> None:
    """Put ``probe`` on the next event loop made, dumping on SIGUSR2."""
    tasks: set[asyncio.Task[None]] = set()

    def start(loop: asyncio.AbstractEventLoop) -> None:
        tasks.add(loop.create_task(probe.run()))
        loop.add_signal_handler(signal.SIGUSR2, probe.dump)

    asyncio.set_event_loop_policy(ProbedLoopPolicy(start))


if __name__ == "__main__":
    from gpu_exporter import cli

    target = os.environ.get(LAG_ENV)
    install(Probe(Path(target) if target else None))
    sys.argv[0] = "gpu-exporter"
    cli.main()
