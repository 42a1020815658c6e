"""CPU the sampler spends per cycle, in-process, with the simulator's own cost subtracted.

The exporter's :class:`~gpu_exporter.sampler.Sampler` is started with ``background=False`` on a
simulated node and driven round by round (a manual clock advances one fast interval per round).
CPU is ``time.process_time()`` (every thread of this process) around ``sample_round`` and one
read of the exposition (each round rendered, as if every round were scraped). The
simulator runs in the same threads, so its cost is measured and subtracted: every C-level entry
point of the fake ``libnvidia-ml`` is wrapped to add its own thread CPU time
(``time.thread_time_ns``) to a counter. What remains is what the exporter would spend on a real
node: collectors, pynvml's Python wrappers (ctypes structs, error mapping), the worker pool, the
event loop and rendering. Not included: the time a real driver spends inside the C library.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from simmeter import SimMeter

from gpu_exporter.app import sampler_settings
from gpu_exporter.collectors import Cadence, collector_names
from gpu_exporter.config import Config
from gpu_exporter.dcgm.readings import DcgmLink
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.migprofiles import MigProfileBook
from gpu_exporter.nvml import ErrorCounter, WorkerPool
from gpu_exporter.sampler import Sampler
from gpu_exporter.simulator import SimulatedNode, install, load_scenario, uninstall


class ManualClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def _overhead_ns_per_call(samples: int = 20000) -> float:
    """process CPU of one metering wrapper around a no-op, outside the part it measures itself."""
    meter = SimMeter.__new__(SimMeter)
    meter._lock, meter.ns, meter.calls = threading.Lock(), 0, 0
    noop = meter._wrap(lambda *a: 0)
    bare = lambda *a: 0  # noqa: E731
    t0 = time.process_time_ns()
    for _ in range(samples):
        bare(1)
    t1 = time.process_time_ns()
    for _ in range(samples):
        noop(1)
    t2 = time.process_time_ns()
    total = ((t2 - t1) - (t1 - t0)) / samples
    return max(0.0, total - meter.ns / samples)


async def _measure(scenario: Path, rounds: int, warmup: int) -> dict[str, Any]:
    clock = ManualClock()
    node = SimulatedNode(load_scenario(scenario), clock=clock)
    meter = SimMeter(node.library)
    install(node)
    pool = WorkerPool(size=4)
    config = Config(listen_host="127.0.0.1", listen_port=0, collectors=frozenset(collector_names()))
    sampler = Sampler(
        sampler_settings(config),
        pool,
        ledger=ActivityLedger(),
        mig_profiles=MigProfileBook(),
        errors=ErrorCounter(),
        dcgm=DcgmLink(),
        clock=clock,
    )
    try:
        await sampler.start(background=False)
        await sampler.sample_round(Cadence.SLOW)
        for _ in range(warmup):
            clock.now += config.fast_interval
            await sampler.sample_round(Cadence.FAST)
        total, sim, calls, render = [], [], [], []
        gc.collect()
        for _ in range(rounds):
            clock.now += config.fast_interval
            sim0, calls0 = meter.ns, meter.calls
            t0 = time.process_time_ns()
            await sampler.sample_round(Cadence.FAST)
            t1 = time.process_time_ns()
            # One read per round, as if every round were scraped (the worst case: rendering
            # waits for a reader, and at a 15 s scrape interval most rounds have none).
            sampler.note_read()
            sampler.exposition  # noqa: B018
            t2 = time.process_time_ns()
            total.append(t2 - t0)
            render.append(t2 - t1)
            sim.append(meter.ns - sim0)
            calls.append(meter.calls - calls0)
        # a slow round (every 30 s by default): ECC, remap, rediscovery
        slow_total, slow_sim = [], []
        for _ in range(3):
            sim0 = meter.ns
            t0 = time.process_time_ns()
            await sampler.sample_round(Cadence.SLOW)
            slow_total.append(time.process_time_ns() - t0)
            slow_sim.append(meter.ns - sim0)
        devices = sum(1 for _ in sampler.devices())
        size = len(sampler.exposition.text)
        series = sum(
            1 for line in sampler.exposition.text.splitlines() if not line.startswith(b"#")
        )
    finally:
        await sampler.stop()
        pool.shutdown()
        node.close()
        uninstall()
    overhead = _overhead_ns_per_call()
    exporter = [(t - s - c * overhead) / 1e6 for t, s, c in zip(total, sim, calls, strict=True)]
    slow_exporter = [
        (t - s - (calls[0] * 2) * overhead) / 1e6 for t, s in zip(slow_total, slow_sim, strict=True)
    ]
    return {
        "devices": devices,
        "series": series,
        "exposition_bytes": size,
        "rounds": rounds,
        "nvml_calls_per_fast_round": statistics.median(calls),
        "fast_round_total_cpu_ms_p50": statistics.median(total) / 1e6,
        "simulator_cpu_ms_p50": statistics.median(sim) / 1e6,
        "meter_overhead_ns_per_call": round(overhead, 1),
        "exporter_cpu_ms_per_fast_round_p50": statistics.median(exporter),
        "exporter_cpu_ms_per_fast_round_mean": statistics.fmean(exporter),
        "render_cpu_ms_p50": statistics.median(render) / 1e6,
        "slow_round_exporter_cpu_ms_p50": statistics.median(slow_exporter),
    }


def measure(scenario: Path, rounds: int = 60, warmup: int = 5) -> dict[str, Any]:
    return asyncio.run(_measure(scenario, rounds, warmup))


if __name__ == "__main__":
    import json
    import sys

    for path in sys.argv[1:]:
        print(path, json.dumps(measure(Path(path)), indent=1))
