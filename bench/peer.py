"""gpu-exporter next to a real peer, nvitop-exporter, on the same simulated node in one run.

Both run as separate processes on the same scenario: gpu-exporter with ``--simulate`` (its own
simulated node and kubelet, through ``exporter_main.py``), nvitop-exporter unmodified under
``gpu-exporter-simulate SCENARIO -- python peer_main.py`` (the simulated node under its pynvml).
Both meter the simulator the same way (``simmeter.SimMeter`` on the node's fake library), so each
process's ``/proc`` CPU is reported raw and net of the simulator, and NVML calls are counted alike.

- **idle**: no scrapes; every server is metered over the same windows (so drift on a shared
  machine hits them alike); median share of a core per window, NVML calls per second;
- **scrapes**: one sequential client, servers taking turns in short bursts, over a keep-alive
  connection and over a new connection per scrape (nvitop-exporter closes after each response, so
  its keep-alive column reconnects too); p50/p99 latency and CPU per scrape (the burst's CPU less
  the server's idle share over the burst's wall time);
- **size**: series, metric families and bytes of one plain scrape; peak RSS (``VmHWM``).
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.metadata
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    BENCH,
    ROOT,
    Http,
    Proc,
    _drain,
    exporter_args,
    log,
    proc_cpu_seconds,
    proc_status_kib,
    start_exporter,
    wait_ready,
)
from loadgen import percentile

PEER = "nvitop-exporter"
OURS = "gpu-exporter"
OURS_NO_KUBELET = "gpu-exporter --no-allocation"
OURS_BEFORE = "gpu-exporter before"  # --before-src: another checkout's src/, in the same windows
MODES = ("keep-alive", "new connection")


@dataclass(frozen=True)
class PeerProfile:
    idle_windows: int  # idle windows, every server metered over each
    idle_seconds: float  # seconds per idle window
    settle_seconds: float  # after start, before anything is measured
    scrape_turns: int  # bursts per (server, mode)
    scrape_burst: float  # seconds of back-to-back scrapes per burst


PEER_FULL = PeerProfile(
    idle_windows=5, idle_seconds=12, settle_seconds=5, scrape_turns=6, scrape_burst=1.0
)
PEER_QUICK = PeerProfile(
    idle_windows=3, idle_seconds=4, settle_seconds=3, scrape_turns=3, scrape_burst=0.5
)
PEER_SMOKE = PeerProfile(
    idle_windows=1, idle_seconds=1, settle_seconds=1, scrape_turns=1, scrape_burst=0.05
)


@dataclass
class Server:
    name: str
    proc: Proc
    meter: Path
    seq: int = 0

    @property
    def port(self) -> int:
        return self.proc.port

    def read_meter(self) -> dict[str, int]:
        """The simulator meter's totals (SIGUSR1, then the file with a newer sequence)."""
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                data: dict[str, int] = json.loads(self.meter.read_text())
                if data["seq"] > self.seq:
                    self.seq = data["seq"]
                    return data
            time.sleep(0.005)
        raise RuntimeError(f"{self.name}: simulator meter did not answer")

    def snapshot(self) -> tuple[float, float, int, int]:
        """(wall, process CPU s, simulator CPU ns, simulator calls)."""
        meter = self.read_meter()
        return time.perf_counter(), proc_cpu_seconds(self.proc.pid), *_meter(meter)


def _meter(data: dict[str, int]) -> tuple[int, int]:
    return data["sim_cpu_ns"], data["sim_calls"]


def peer_version() -> str:
    return importlib.metadata.version(PEER)


def simulate_command() -> list[str]:
    script = Path(sys.executable).parent / "gpu-exporter-simulate"
    if script.exists():
        return [str(script)]
    code = "import sys; from gpu_exporter.simulate_cli import main; sys.exit(main())"
    return [sys.executable, "-c", code]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_ours(
    name: str, scenario: Path, work: Path, extra: list[str], src: Path | None = None
) -> Server:
    work.mkdir(parents=True, exist_ok=True)
    (work / "state").mkdir(exist_ok=True)
    (work / "kmsg").touch()
    meter = work / "sim-meter.json"
    flags = exporter_args(scenario, work, extra)
    command = [sys.executable, str(BENCH / "exporter_main.py"), *flags]
    env = {"BENCH_SIM_METER": str(meter)}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    proc = start_exporter(command, env)
    wait_ready(proc)
    return Server(name, proc, meter)


def start_peer(scenario: Path, work: Path) -> Server:
    """nvitop-exporter (default 1 s interval) under the simulate command, ready when it answers."""
    work.mkdir(parents=True, exist_ok=True)
    meter = work / "sim-meter.json"
    port = free_port()
    command = [
        *simulate_command(),
        str(scenario),
        "--",
        sys.executable,
        str(BENCH / "peer_main.py"),
        "--bind-address=127.0.0.1",
        f"--port={port}",
        "--hostname=bench",
    ]
    popen = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "BENCH_SIM_METER": str(meter)},
        cwd=ROOT,
    )
    proc = Proc(popen, time.perf_counter(), port=port)
    threading.Thread(target=_drain, args=(proc,), daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            break
        with contextlib.suppress(OSError, http.client.HTTPException):
            client = Http(port)
            try:
                status, body = client.get("/metrics")
            finally:
                client.close()
            if status == 200 and b"gpu_" in body:
                return Server(PEER, proc, meter)
        time.sleep(0.05)
    proc.stop()
    raise RuntimeError(f"{PEER} did not start:\n" + "\n".join(proc.tail))


# --------------------------------------------------------------------------- measurements


def exposition_stats(server: Server) -> dict[str, int]:
    client = Http(server.port)
    try:
        status, body = client.get("/metrics")
    finally:
        client.close()
    if status != 200:
        raise RuntimeError(f"{server.name}: /metrics answered {status}")
    lines = body.splitlines()
    return {
        "bytes": len(body),
        "series": sum(1 for ln in lines if ln and not ln.startswith(b"#")),
        "families": sum(1 for ln in lines if ln.startswith(b"# TYPE ")),
    }


def measure_idle(servers: list[Server], windows: int, seconds: float) -> dict[str, dict[str, Any]]:
    """Every server metered over the same windows, no scrapes: medians of the per-window shares."""
    rows: dict[str, list[tuple[float, float, float]]] = {s.name: [] for s in servers}
    before = {s.name: s.snapshot() for s in servers}
    for _ in range(windows):
        time.sleep(seconds)
        for server in servers:
            now = server.snapshot()
            w0, c0, n0, k0 = before[server.name]
            w1, c1, n1, k1 = now
            wall, cpu, sim = w1 - w0, c1 - c0, (n1 - n0) / 1e9
            rows[server.name].append(
                (100 * cpu / wall, 100 * max(0.0, cpu - sim) / wall, (k1 - k0) / wall)
            )
            before[server.name] = now
    out: dict[str, dict[str, Any]] = {}
    for name, values in rows.items():
        raw, net, calls = zip(*values, strict=True)
        out[name] = {
            "windows": len(values),
            "window_seconds": seconds,
            "share_percent_raw_p50": statistics.median(raw),
            "share_percent_net_p50": statistics.median(net),
            "share_percent_net_windows": [round(v, 3) for v in net],
            "nvml_calls_per_second_p50": statistics.median(calls),
        }
    return out


def _scrape(port: int, client: Http | None) -> tuple[int, Http | None]:
    """One GET /metrics; latency in ns. ``client`` None: a new connection for this scrape."""
    own = client is None
    conn = Http(port) if client is None else client
    t0 = time.perf_counter_ns()
    status, body = conn.get("/metrics")
    elapsed = time.perf_counter_ns() - t0
    if own:
        conn.close()
    if status != 200 or not body.endswith(b"\n"):
        raise RuntimeError(f"scrape of port {port}: status {status}, {len(body)} bytes")
    return elapsed, None if own else conn


def measure_scrapes(
    servers: list[Server], idle: dict[str, dict[str, Any]], turns: int, burst: float
) -> dict[str, dict[str, dict[str, Any]]]:
    """Servers take turns in bursts of ``burst`` seconds of back-to-back scrapes, per mode.

    CPU per scrape: the bursts' CPU less the server's idle share over their wall time, over all
    of a (server, mode)'s scrapes (``/proc`` counts in clock ticks, 10 ms: one burst is too short).
    """
    lat: dict[tuple[str, str], list[int]] = {}
    cpu: dict[tuple[str, str], float] = {}
    for _ in range(turns):
        for mode in MODES:
            for server in servers:
                client = Http(server.port) if mode == "keep-alive" else None
                w0, c0 = time.perf_counter(), proc_cpu_seconds(server.proc.pid)
                samples = []
                while not samples or time.perf_counter() - w0 < burst:
                    ns, client = _scrape(server.port, client)
                    samples.append(ns)
                w1, c1 = time.perf_counter(), proc_cpu_seconds(server.proc.pid)
                if client is not None:
                    client.close()
                background = idle[server.name]["share_percent_raw_p50"] / 100 * (w1 - w0)
                key = (server.name, mode)
                lat.setdefault(key, []).extend(samples)
                cpu[key] = cpu.get(key, 0.0) + (c1 - c0) - background
    out: dict[str, dict[str, dict[str, Any]]] = {s.name: {} for s in servers}
    for (name, mode), values in lat.items():
        ordered = sorted(values)
        out[name][mode] = {
            "scrapes": len(ordered),
            "p50_ms": percentile(ordered, 50) / 1e6,
            "p99_ms": percentile(ordered, 99) / 1e6,
            "cpu_ms_per_scrape": 1000 * max(0.0, cpu[(name, mode)]) / len(ordered),
        }
    return out


def compare(
    scenario: Path,
    profile: PeerProfile,
    *,
    no_kubelet: bool = True,
    extra: list[str] | None = None,
    before_src: Path | None = None,
) -> dict[str, Any]:
    """Start the servers, measure idle then scrapes, and stop them; every number in one dict.

    ``before_src``: also an exporter from that ``src/`` directory (a before/after in one run)."""
    extra = list(extra or [])
    servers: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
        work = Path(tmp)
        try:
            servers.append(start_peer(scenario, work / "peer"))
            servers.append(start_ours(OURS, scenario, work / "ours", extra))
            if no_kubelet:
                lean = [*extra, "--no-allocation"]
                servers.append(start_ours(OURS_NO_KUBELET, scenario, work / "lean", lean))
            if before_src is not None:
                servers.append(
                    start_ours(OURS_BEFORE, scenario, work / "before", extra, before_src)
                )
            time.sleep(profile.settle_seconds)
            sizes = {s.name: exposition_stats(s) for s in servers}
            log(
                f"peer: idle, {profile.idle_windows} x {profile.idle_seconds:.0f} s, "
                + ", ".join(s.name for s in servers)
            )
            idle = measure_idle(servers, profile.idle_windows, profile.idle_seconds)
            idle_rss = {s.name: proc_status_kib(s.proc.pid, "VmHWM") / 1024 for s in servers}
            log(f"peer: scrapes, {profile.scrape_turns} turns of {profile.scrape_burst} s per mode")
            scraped = [s for s in servers if s.name not in (OURS_NO_KUBELET, OURS_BEFORE)]
            scrapes = measure_scrapes(scraped, idle, profile.scrape_turns, profile.scrape_burst)
            rss = {s.name: proc_status_kib(s.proc.pid, "VmHWM") / 1024 for s in servers}
        finally:
            for server in servers:
                server.proc.stop()
    return {
        "scenario": str(scenario.relative_to(ROOT) if scenario.is_relative_to(ROOT) else scenario),
        "peer_version": peer_version(),
        "profile": profile.__dict__,
        "servers": {
            s.name: {
                **sizes[s.name],
                "idle": idle[s.name],
                "idle_peak_rss_mib": idle_rss[s.name],
                "peak_rss_mib": rss[s.name],
                "scrapes": scrapes.get(s.name, {}),
                "nvml_calls_per_second_per_series": idle[s.name]["nvml_calls_per_second_p50"]
                / max(1, sizes[s.name]["series"]),
            }
            for s in servers
        },
    }


def peer_table(result: dict[str, Any]) -> str:
    """The comparison as a Markdown table, one column per server."""
    servers = result["servers"]
    names = list(servers)

    def row(title: str, fn: Any) -> str:
        cells = []
        for name in names:
            try:
                cells.append(fn(servers[name]))
            except KeyError:
                cells.append("-")
        return f"| {title} | " + " | ".join(cells) + " |"

    lines = [
        "| | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        row("series / families", lambda s: f"{s['series']} / {s['families']}"),
        row("bytes (plain)", lambda s: f"{s['bytes'] / 1024:.0f} KiB"),
        row(
            "idle CPU, % of a core (net of simulator)",
            lambda s: f"{s['idle']['share_percent_net_p50']:.2f}",
        ),
        row("idle CPU raw", lambda s: f"{s['idle']['share_percent_raw_p50']:.2f}"),
        row("NVML calls/s", lambda s: f"{s['idle']['nvml_calls_per_second_p50']:.1f}"),
        row(
            "NVML calls/s per series",
            lambda s: f"{s['nvml_calls_per_second_per_series']:.3f}",
        ),
        row("peak RSS MiB", lambda s: f"{s['peak_rss_mib']:.1f}"),
    ]
    for mode in MODES:
        lines.append(
            row(
                f"scrape p50 / p99 ms, {mode}",
                lambda s, m=mode: (
                    f"{s['scrapes'][m]['p50_ms']:.2f} / {s['scrapes'][m]['p99_ms']:.2f}"
                ),
            )
        )
        lines.append(
            row(
                f"CPU ms per scrape, {mode}",
                lambda s, m=mode: f"{s['scrapes'][m]['cpu_ms_per_scrape']:.2f}",
            )
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="gpu-exporter against nvitop-exporter")
    parser.add_argument("--scenario", type=Path, default=BENCH / "scenarios" / "gpu8.yaml")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--before-src", type=Path, help="also run the exporter from this src/")
    args = parser.parse_args()
    profile = PEER_QUICK if args.quick else PEER_FULL
    data = compare(args.scenario, profile, before_src=args.before_src)
    print(peer_table(data), end="")
    if args.out:
        args.out.write_text(json.dumps(data, indent=1) + "\n")
