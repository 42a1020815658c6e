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
import sys
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


class CpuMeter:
    """Thread CPU time spent in chosen Python functions (the simulated kubelet's), no call count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ns = 0

    def wrap(self, owner: Any, name: str) -> None:
        fn = getattr(owner, name, None)
        if fn is None:
            return
        clock = time.thread_time_ns
        meter = self

        def metered(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = clock() - start
                with meter._lock:
                    meter.ns += spent

        metered.__name__ = fn.__name__
        setattr(owner, name, metered)

    def add(self, ns: int) -> None:
        with self._lock:
            self.ns += ns

    def wrap_async(self, fn: Any) -> Any:
        """A coroutine function metered around its await: exact for one that never suspends
        (the simulated kubelet's handlers), as nothing else runs on its thread meanwhile."""
        clock = time.thread_time_ns

        async def metered(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.add(clock() - start)

        metered.__name__ = getattr(fn, "__name__", "handler")
        return metered


METERS: list[SimMeter] = []
KUBELET = CpuMeter()


def meter_kubelet(kubelet: Any) -> None:
    """Meter the simulated kubelet's own work as simulator: its answers (the state they are read
    from, building and serialising them), its process and pod-log (and CDI) trees, and its side
    of the HTTP/2 connections (grpclib's protocol on each connection it accepts: h2's state
    machine and the server's frame handling). What stays unmetered is small: the handlers'
    asyncio tasks and socket reads, the client's side."""
    if kubelet is None:
        return
    if hasattr(kubelet, "sync_files"):  # the whole refresh, in one function on a worker thread
        KUBELET.wrap(kubelet, "sync_files")
    else:
        KUBELET.wrap(kubelet, "_processes")
    served = getattr(kubelet, "_server", None)
    server = sys.modules["gpu_exporter.simulator.podresources_server"]
    for name in ("list_response", "allocatable_response"):
        KUBELET.wrap(server, name)
    if served is not None:  # its servicer reads state() through _provider
        KUBELET.wrap(served, "_provider")
    _meter_server_connections(server)
    for attribute in () if hasattr(kubelet, "sync_files") else ("_tree", "_cdi"):
        tree = getattr(kubelet, attribute, None)
        if tree is not None:
            KUBELET.wrap(tree, "sync")


def _meter_server_connections(server: Any) -> None:
    """Every connection the simulated kubelet accepts from now on: its ``data_received``."""
    cls = server._Server
    if getattr(cls, "_bench_metered", False):
        return
    original = cls._protocol_factory

    def protocol_factory(self: Any) -> Any:
        protocol = original(self)
        KUBELET.wrap(protocol, "data_received")
        return protocol

    cls._protocol_factory = protocol_factory
    cls._bench_metered = True


def metered_install(original: Any) -> Any:
    """``simulator.install`` that meters the node's library before installing it."""

    def install(node: Any) -> None:
        METERS.append(SimMeter(node.library))
        original(node)

    return install


def thread_cpu() -> dict[str, float]:
    """CPU seconds (utime+stime) of each live thread of this process, by thread name.

    Python threads by ``threading`` name (``name#tid`` when two share one), others (C libraries'
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
            "sim_cpu_ns": sum(m.ns for m in METERS) + KUBELET.ns,
            "kubelet_cpu_ns": KUBELET.ns,
            "sim_calls": sum(m.calls for m in METERS),
            "threads": thread_cpu(),
        }
        tmp = f"{target}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, target)

    signal.signal(signal.SIGUSR1, dump)
