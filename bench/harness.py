"""Pieces the bench scripts share: the real exporter as a child process, its readiness, its
memory and CPU from /proc, a keep-alive HTTP client, and a description of the machine.

Used by ``run.py`` (the benchmark) and ``soak.py`` (the soak).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import json
import os
import platform
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
STARTUP_LIMIT = 60.0


def log(message: str, tag: str = "bench") -> None:
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    """A child process whose stderr is drained on a thread (the last lines kept for errors).

    ``levels`` counts the exporter's JSON log lines by level and ``events`` the warning and error
    events by name, so a long run can report what the exporter complained about.
    """

    popen: subprocess.Popen[str]
    started: float
    tail: list[str] = field(default_factory=list)
    listening: threading.Event = field(default_factory=threading.Event)
    port: int = 0
    levels: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def _drain(proc: Proc) -> None:
    assert proc.popen.stderr is not None
    for line in proc.popen.stderr:
        proc.tail = [*proc.tail[-30:], line.rstrip()]
        if not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError, KeyError, AttributeError):
            event = json.loads(line)
            level = str(event.get("level", "?"))
            proc.levels[level] += 1
            if level in ("warning", "error", "critical"):
                proc.events[f"{level}: {event.get('event')}"] += 1
            if not proc.listening.is_set() and event.get("event") == "listening":
                proc.port = int(event["address"].rsplit(":", 1)[1])
                proc.listening.set()


# The environment the image and the DaemonSet give gpu-exporter (Dockerfile, deploy/daemonset.yaml),
# so its RSS here is the RSS it has there; the peers run as their own packages ship them.
DEPLOYED_ENV = {"MALLOC_ARENA_MAX": "2"}


def start_gpu_exporter(command: list[str], env: dict[str, str] | None = None) -> Proc:
    """:func:`start_exporter` for gpu-exporter itself, with its deployed environment."""
    return start_exporter(command, {**DEPLOYED_ENV, **(env or {})})


def start_exporter(command: list[str], env: dict[str, str] | None = None) -> Proc:
    started = time.perf_counter()
    popen = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        cwd=ROOT,
    )
    proc = Proc(popen, started)
    threading.Thread(target=_drain, args=(proc,), daemon=True).start()
    deadline = time.monotonic() + STARTUP_LIMIT
    while not proc.listening.wait(0.01):
        if popen.poll() is not None or time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError("exporter did not start:\n" + "\n".join(proc.tail))
    return proc


def exporter_args(scenario: Path, work: Path, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Flags for a simulated exporter whose kernel log and state live under ``work``."""
    return [
        "--simulate",
        str(scenario),
        "--listen=127.0.0.1:0",
        "--log-format=json",
        "--log-level=info",  # the "listening" line is info
        f"--kmsg-path={work / 'kmsg'}",
        f"--state-dir={work / 'state'}",
        *extra,
    ]


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def proc_status_kib(pid: int, key: str) -> int:
    """A ``/proc/PID/status`` line in KiB (``VmRSS``, ``VmHWM``...); 0 when absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


# --------------------------------------------------------------------------- HTTP


class Http:
    """One keep-alive connection to 127.0.0.1:port (over TLS with ``tls``)."""

    def __init__(self, port: int, tls: ssl.SSLContext | None = None) -> None:
        self._conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=tls)
            if tls is not None
            else http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        )

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        return self.request("GET", path, headers=headers)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        try:
            self._conn.request(method, path, body=body, headers=headers or {})
            response = self._conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            self._conn.close()
            raise

    def close(self) -> None:
        self._conn.close()


def wait_ready(proc: Proc, tls: ssl.SSLContext | None = None) -> float:
    """Poll /readyz (every 5 ms) until 200; returns seconds since the process was started."""
    client = Http(proc.port, tls)
    deadline = time.monotonic() + STARTUP_LIMIT
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, http.client.HTTPException):
                status, _ = client.get("/readyz")
                if status == 200:
                    return time.perf_counter() - proc.started
            if proc.popen.poll() is not None:
                break
            time.sleep(0.005)
    finally:
        client.close()
    raise RuntimeError("exporter never became ready:\n" + "\n".join(proc.tail))


# --------------------------------------------------------------------------- report


def machine_info() -> dict[str, Any]:
    """Where and when a run happened: CPU, memory, kernel, Python, commit, load."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kib = int(Path("/proc/meminfo").read_text().splitlines()[0].split()[1])
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    ).stdout.strip()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "commit": commit,
        "loadavg_at_start": os.getloadavg(),
    }


def write_json(path: Path, data: Any) -> None:
    """Write atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)
