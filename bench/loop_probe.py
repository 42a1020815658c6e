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
discard the start, and one at the end of its window. Each dump also counts the garbage
collections of each generation over its window (``collections``).

The lateness is kept as a histogram of 0.1 ms buckets (a few hundred integers at most), so the
probe adds nothing measurable to the process's memory; its CPU (100 wake-ups a second) is why
the bench runs it in a process of its own, never in the one whose CPU and RSS it reports.

With ``$BENCH_LOOP_TRACE`` set to a file, the probe also says what each long wake-up waited for
(``StallTrace``): every loop callback that ran at least ``$BENCH_LOOP_TRACE_MS`` (default 2 ms),
with its wall and loop-thread CPU time; every garbage collection, on whichever thread, with its
generation, wall and CPU time and, for a full one, the objects it traversed; and, per wake-up at
least that late, the loop thread's and the whole process's CPU over its sleep, the threads that
ran over it (name, CPU, where each stack is at the wake-up), and the callbacks and collections
that overlapped it. CPU time is what names a culprit on a shared machine: a
callback's wall time also counts the time its thread waited for a core or for the GIL. Written
with each dump (JSON, the same sequence number).
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LAG_ENV = "BENCH_LOOP_LAG"
TRACE_ENV = "BENCH_LOOP_TRACE"
TRACE_MS_ENV = "BENCH_LOOP_TRACE_MS"
TRACE_MS = 2.0
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


class StallTrace:
    """What the loop was doing while a wake-up was late: long callbacks and garbage collections.

    Times are ``time.monotonic()`` (the loop's clock); CPU is ``time.thread_time()`` of the thread
    that ran the callback or the collection, so a culprit shows by what it cost, not by how long
    a contended machine made it last. Installed before the loop runs: it wraps
    ``asyncio.Handle._run`` (every callback, task steps included) and appends to ``gc.callbacks``.
    """

    def __init__(self, target: Path, threshold_ms: float = TRACE_MS) -> None:
        self.target = target
        self.threshold_s = threshold_ms / 1000
        self.callbacks: list[dict[str, Any]] = []
        self.collections: list[dict[str, Any]] = []
        self.wakeups: list[dict[str, Any]] = []
        self.gc_totals: dict[int, dict[str, float]] = {}
        self._gc_started = threading.local()

    def install(self) -> None:
        run = asyncio.events.Handle._run
        trace = self

        def timed_run(handle: asyncio.events.Handle) -> None:
            t0, c0 = time.monotonic(), time.thread_time()
            try:
                run(handle)
            finally:
                wall = time.monotonic() - t0
                if wall >= trace.threshold_s:
                    trace.callbacks.append(
                        {
                            "at": t0,
                            "wall_ms": wall * 1000,
                            "cpu_ms": (time.thread_time() - c0) * 1000,
                            "what": describe(handle),
                        }
                    )

        asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            # A full collection traverses every tracked object: count them (outside the timing).
            objects = len(gc.get_objects()) if info["generation"] == 2 else None
            self._gc_started.value = (time.monotonic(), time.thread_time(), objects)
            return
        started = getattr(self._gc_started, "value", None)
        if started is None:
            return
        t0, c0, objects = started
        wall, cpu = time.monotonic() - t0, time.thread_time() - c0
        generation = info["generation"]
        totals = self.gc_totals.setdefault(
            generation, {"count": 0, "cpu_ms": 0.0, "max_cpu_ms": 0.0, "max_wall_ms": 0.0}
        )
        totals["count"] += 1
        totals["cpu_ms"] += cpu * 1000
        totals["max_cpu_ms"] = max(totals["max_cpu_ms"], cpu * 1000)
        totals["max_wall_ms"] = max(totals["max_wall_ms"], wall * 1000)
        if wall >= self.threshold_s / 4 or generation == 2:
            self.collections.append(
                {
                    "at": t0,
                    "wall_ms": wall * 1000,
                    "cpu_ms": cpu * 1000,
                    "generation": generation,
                    "thread": threading.current_thread().name,
                    "collected": info["collected"],
                    "objects": objects,
                }
            )

    def thread_cpu(self) -> dict[int, float]:
        """Each live thread's CPU seconds so far, by thread id (one clock read per thread)."""
        cpu: dict[int, float] = {}
        for thread in threading.enumerate():
            if thread.ident is None:
                continue
            try:
                cpu[thread.ident] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except (OSError, ValueError):  # ended between the listing and the read
                continue
        return cpu

    def wakeup(
        self,
        due: float,
        woke: float,
        loop_cpu_s: float,
        process_cpu_s: float,
        threads_before: dict[int, float] | None = None,
    ) -> None:
        """One wake-up of the probe, late by ``woke - due``; the CPU the loop thread and the
        process spent over its sleep tells a busy loop from a loop waiting for the GIL (the
        process busy elsewhere) or for a core (neither busy). With ``threads_before`` (each
        thread's CPU when the sleep began), the threads that ran over the sleep are named with
        their CPU and where each one is at the wake-up: on a simulated node, where a worker
        thread spent CPU it held the GIL, so that is who the loop waited for."""
        if woke - due < self.threshold_s:
            return
        wake: dict[str, Any] = {
            "at": woke,
            "late_ms": (woke - due) * 1000,
            "loop_cpu_ms": loop_cpu_s * 1000,
            "process_cpu_ms": process_cpu_s * 1000,
        }
        if threads_before is not None:
            names = {t.ident: t.name for t in threading.enumerate()}
            frames = sys._current_frames()
            busy = []
            for ident, cpu in self.thread_cpu().items():
                spent = (cpu - threads_before.get(ident, cpu)) * 1000
                if spent >= 0.5:
                    busy.append(
                        {
                            "thread": names.get(ident, str(ident)),
                            "cpu_ms": spent,
                            "now_at": _where(frames.get(ident)),
                        }
                    )
            wake["threads"] = sorted(busy, key=lambda t: -t["cpu_ms"])
        self.wakeups.append(wake)

    def dump(self, seq: int) -> None:
        """Write what was traced since the last dump, each long wake-up with what overlapped its
        sleep (a callback or collection that ended after the sleep began and began before the
        wake-up), and start again."""
        for wake in self.wakeups:
            start = wake["at"] - wake["late_ms"] / 1000 - INTERVAL_S
            wake["overlapping"] = [
                {"kind": kind, **event}
                for kind, events in (("callback", self.callbacks), ("gc", self.collections))
                for event in events
                if event["at"] < wake["at"] and event["at"] + event["wall_ms"] / 1000 > start
            ]
        data = {
            "seq": seq,
            "threshold_ms": self.threshold_s * 1000,
            "gc_totals": {str(g): t for g, t in sorted(self.gc_totals.items())},
            "wakeups": self.wakeups,
            "callbacks": self.callbacks,
            "collections": self.collections,
        }
        self.callbacks, self.collections, self.wakeups, self.gc_totals = [], [], [], {}
        tmp = self.target.with_name(self.target.name + ".tmp")
        tmp.write_text(json.dumps(data, default=str))
        os.replace(tmp, self.target)


def _where(frame: Any) -> list[str]:
    """The innermost few frames of a thread's stack, as ``file:line function``."""
    where: list[str] = []
    while frame is not None and len(where) < 6:
        code = frame.f_code
        where.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return where


def describe(handle: asyncio.events.Handle) -> str:
    """A callback by name: a task step as its coroutine and where it stopped, else its repr."""
    callback = getattr(handle, "_callback", None)
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        frame = getattr(coro, "cr_frame", None)
        where = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
        return f"task {getattr(coro, '__qualname__', coro)}{where}"
    return repr(callback)


class Probe:
    """Sleeps ``interval_s`` on the running loop, forever, recording each wake-up's lateness."""

    def __init__(
        self, target: Path | None, interval_s: float = INTERVAL_S, trace: StallTrace | None = None
    ) -> None:
        self.target = target
        self.interval_s = interval_s
        self.trace = trace
        self.histogram = LagHistogram()
        self.collections = _collections()
        self.seq = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                loop_cpu, process_cpu = time.thread_time(), time.process_time()
                threads = self.trace.thread_cpu() if self.trace is not None else None
                due = loop.time() + self.interval_s
                await asyncio.sleep(self.interval_s)
                woke = loop.time()
                self.histogram.record(woke - due)
                if self.trace is not None:
                    self.trace.wakeup(
                        due,
                        woke,
                        time.thread_time() - loop_cpu,
                        time.process_time() - process_cpu,
                        threads,
                    )
        finally:
            self.dump()

    def dump(self) -> None:
        """Write the distribution since the last dump and start a new one."""
        self.seq += 1
        data = {"seq": self.seq, **self.histogram.summary(self.interval_s)}
        collections = _collections()
        data["collections"] = {
            str(generation): n - self.collections[generation]
            for generation, n in enumerate(collections)
        }
        self.histogram, self.collections = LagHistogram(self.histogram.resolution_ms), collections
        if self.trace is not None:  # first: whoever sees the new sequence finds its trace written
            self.trace.dump(self.seq)
        if self.target is not None:
            tmp = self.target.with_name(self.target.name + ".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.target)


def _collections() -> list[int]:
    """Garbage collections per generation since the process started (free to read: the
    interpreter counts them anyway). A full (generation 2) collection traverses every tracked
    object, the imported modules' included, so it is the longest pause the loop can meet."""
    return [generation["collections"] for generation in gc.get_stats()]


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

    target, trace_target = os.environ.get(LAG_ENV), os.environ.get(TRACE_ENV)
    trace = None
    if trace_target:
        trace = StallTrace(Path(trace_target), float(os.environ.get(TRACE_MS_ENV, TRACE_MS)))
        trace.install()
    install(Probe(Path(target) if target else None, trace=trace))
    sys.argv[0] = "gpu-exporter"
    cli.main()
