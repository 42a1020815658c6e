"""The simulator's own CPU, metered the same way in every process that runs it (standard library
only, so metering a third-party program adds no import of ours to its memory).

:class:`SimMeter` wraps every C-level entry point of the fake ``libnvidia-ml`` to add its own thread
CPU time (``time.thread_time_ns``) and one call to a counter. :func:`install_dump` makes SIGUSR1
write ``{"seq", "sim_cpu_ns", "sim_calls"}`` to the file named by ``BENCH_SIM_METER``, so a harness
can subtract the simulator's share from the process's ``/proc`` CPU time and count NVML calls.
Used by ``exporter_main.py`` (gpu-exporter) and ``peer_main.py`` (nvitop-exporter).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

METER_ENV = "BENCH_SIM_METER"


class SimMeter:
    """Wraps the fake library's entry points to count the CPU time spent inside the simulator."""

    def __init__(self, library: Any) -> None:
        self._lock = threading.Lock()
        self.ns = 0
        self.calls = 0
        for name in list(vars(library)):
            if name.startswith("nvml") and callable(getattr(library, name)):
                setattr(library, name, self._wrap(getattr(library, name)))

    def _wrap(self, fn: Any) -> Any:
        clock = time.thread_time_ns
        meter = self

        def metered(*args: Any) -> Any:
            start = clock()
            try:
                return fn(*args)
            finally:
                spent = clock() - start
                with meter._lock:
                    meter.ns += spent
                    meter.calls += 1

        metered.__name__ = fn.__name__
        return metered


METERS: list[SimMeter] = []


def metered_install(original: Any) -> Any:
    """``simulator.install`` that meters the node's library before installing it."""

    def install(node: Any) -> None:
        METERS.append(SimMeter(node.library))
        original(node)

    return install


def thread_cpu() -> dict[str, float]:
    """CPU seconds (utime+stime) of each live thread of this process, by thread name.

    Python threads by ``threading`` name (``name#tid`` when two share one), others (gRPC's C
    threads) by their kernel ``comm``.
    """
    names = {t.native_id: t.name for t in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                comm, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        name = names.get(int(tid)) or comm.split("(", 1)[1]
        if name in out:
            name = f"{name}#{tid}"
        out[name] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def install_dump() -> None:
    """SIGUSR1 writes the meters' totals to ``$BENCH_SIM_METER`` (atomically, with a sequence)."""
    seq = 0

    def dump(signum: int, frame: object) -> None:
        nonlocal seq
        seq += 1
        target = os.environ.get(METER_ENV)
        if not target:
            return
        data = {
            "seq": seq,
            "sim_cpu_ns": sum(m.ns for m in METERS),
            "sim_calls": sum(m.calls for m in METERS),
            "threads": thread_cpu(),
        }
        tmp = f"{target}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, target)

    signal.signal(signal.SIGUSR1, dump)
