"""gpu-exporter benchmark: ``make bench`` (``python bench/run.py [--quick] [...]``).

For each node shape (bench/scenarios/*.yaml) it starts the real exporter process on the simulator
and measures:

- scrape latency p50/p99 at 1, 8 and 64 concurrent keep-alive scrapers, plain and gzip, for the
  exporter and for (a), a prometheus_client collector + generate_latest per scrape on aiohttp
  serving the same series; at 8, the goal cells, each server's median of five;
- sampler CPU per fast cycle, in-process, with the simulator's own CPU subtracted;
- whole-process CPU share at default intervals (fast 1 s, slow 30 s) and peak RSS (VmHWM);
- Xid latency: a kernel-log record appended to ``--kmsg-path`` until the counter shows in /metrics;
- time from process start to ``/readyz`` 200.

Then, once per run: the event loop's stalls on ``mig56`` scraped every second (loop_probe.py), and
the peer, nvitop-exporter, on the same node (peer.py). It prints a table and writes JSON (default
``bench/results/latest.json``), with the goals' verdicts (goals.py). See bench/README.md and
docs/performance.md. This is a benchmark, never a test: goals are reported, not asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import goals
import harness
from harness import (
    BENCH,
    ROOT,
    Http,
    Proc,
    log,
    proc_cpu_seconds,
    proc_status_kib,
    start_gpu_exporter,
    wait_ready,
)
from loadgen import LoadResult, median_cell, percentile, pick_generator, run_load
from loop_probe import LAG_ENV, TRACE_ENV
from peer import PEER_FULL, PEER_QUICK, compare, peer_table

SHAPES = {
    "gpu8": ("8x H100", BENCH / "scenarios" / "gpu8.yaml"),
    "mig56": ("8x H100 x 7 MIG (1g.10gb), 100 pods", BENCH / "scenarios" / "mig56.yaml"),
    "gpu16": ("16x H200", BENCH / "scenarios" / "gpu16.yaml"),
}
CONCURRENCY = (1, 8, 64)
GOAL_CONCURRENCY = goals.GOAL_CONCURRENCY
SERVERS = ("exporter", "paused", "client")
SERVER_TITLES = {
    "exporter": "gpu-exporter",
    "paused": "exporter, no sampling",
    "client": "(a) prometheus_client",
}
# What a Prometheus scrape sends: the stall cell scrapes as Prometheus does.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    "Accept-Encoding": "gzip",
}
XID_CODE = 13


@dataclass
class Profile:
    cell_seconds: float
    cpu_seconds: float
    xid_samples: int
    ready_runs: int
    sampler_rounds: int
    paused: bool  # also measure an exporter whose sampler never runs after the first round
    goal_repeats: int  # cells at GOAL_CONCURRENCY, servers taking turns; the median p99's is kept
    stall_seconds: float  # the loop-lag window on the goal shape, scraped every second


FULL = Profile(
    cell_seconds=3,
    cpu_seconds=45,
    xid_samples=40,
    ready_runs=3,
    sampler_rounds=100,
    paused=True,
    goal_repeats=5,
    stall_seconds=300,
)
QUICK = Profile(
    cell_seconds=1,
    cpu_seconds=6,
    xid_samples=8,
    ready_runs=1,
    sampler_rounds=20,
    paused=False,
    goal_repeats=1,
    stall_seconds=20,
)
PAUSED_FLAGS = ("--fast-interval=1h", "--slow-interval=1h")
EXTRA_ARGS: list[str] = []  # --exporter-args, appended to every exporter command line
PARTS = ("sampler", "ready", "cpu", "xid", "latency", "stall", "peer")
STALL_WARMUP_S = 5.0  # after /readyz: the first rounds, the first allocation poll


def exporter_args(scenario: Path, work: Path) -> list[str]:
    return harness.exporter_args(scenario, work, EXTRA_ARGS)


def start_baseline(kind: str, exposition: Path) -> Proc:
    popen = subprocess.Popen(
        [sys.executable, str(BENCH / "baselines.py"), kind, str(exposition)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    proc = Proc(popen, time.perf_counter())
    assert popen.stdout is not None
    line = popen.stdout.readline()
    if not line.startswith("PORT "):
        proc.stop()
        raise RuntimeError(f"baseline {kind} did not start: {line!r}")
    proc.port = int(line.split()[1])
    return proc


# --------------------------------------------------------------------------- measurements


def measure_ready(scenario: Path, work: Path, runs: int) -> dict[str, Any]:
    times = []
    for _ in range(runs):
        proc = start_gpu_exporter(
            [sys.executable, "-m", "gpu_exporter", *exporter_args(scenario, work)]
        )
        try:
            times.append(wait_ready(proc))
        finally:
            proc.stop()
    return {
        "runs": runs,
        "seconds_p50": statistics.median(times),
        "seconds_max": max(times),
        "samples": [round(t, 3) for t in times],
    }


def read_meter(proc: Proc, path: Path, previous_seq: int) -> dict[str, int]:
    os.kill(proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            data: dict[str, int] = json.loads(path.read_text())
            if data["seq"] > previous_seq:
                return data
        time.sleep(0.005)
    raise RuntimeError("simulator meter did not answer")


def measure_cpu_share(proc: Proc, meter: Path, seconds: float) -> dict[str, Any]:
    """utime+stime over ``seconds`` at default intervals, with one scrape every 15 s."""
    client = Http(proc.port)
    m0 = read_meter(proc, meter, 0)
    c0, w0 = proc_cpu_seconds(proc.pid), time.perf_counter()
    scrapes = 0
    next_scrape = time.monotonic()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if time.monotonic() >= next_scrape:
            client.get("/metrics")
            scrapes += 1
            next_scrape += 15
        time.sleep(min(0.5, max(0.0, end - time.monotonic())))
    c1, w1 = proc_cpu_seconds(proc.pid), time.perf_counter()
    m1 = read_meter(proc, meter, m0["seq"])
    client.close()
    wall = w1 - w0
    cpu = c1 - c0
    sim = (m1["sim_cpu_ns"] - m0["sim_cpu_ns"]) / 1e9
    return {
        "wall_seconds": round(wall, 2),
        "scrapes": scrapes,
        "process_cpu_seconds": round(cpu, 4),
        "simulator_cpu_seconds": round(sim, 4),
        "simulator_nvml_calls": m1["sim_calls"] - m0["sim_calls"],
        "share_percent_raw": 100 * cpu / wall,
        "share_percent_net": 100 * max(0.0, cpu - sim) / wall,
        "clock_ticks_per_second": os.sysconf("SC_CLK_TCK"),
    }


_SERIES_RE = re.compile(r"^gpu_xid_errors_total\{[^}]*\} (\S+)$", re.M)
_GPU_INFO_RE = re.compile(r'^gpu_info\{[^}]*gpu="(\d+)"[^}]*pci_bus_id="([^"]+)"', re.M)
_KMSG_SEQ_RE = re.compile(r"^\d+,(\d+),(\d+),")


def xid_total(body: str) -> float:
    return sum(float(v) for v in _SERIES_RE.findall(body))


def xid_wired(body: str) -> bool:
    return "gpu_xid_" in body or 'source="kmsg"' in body


def kmsg_bus(pci_bus_id: str) -> str:
    """``00000000:18:00.0`` (NVML) -> ``0000:18:00`` (the kernel log's form)."""
    domain, bus, device = pci_bus_id.split(".")[0].split(":")
    return f"{domain[-4:]}:{bus}:{device}".lower()


def measure_xid(proc: Proc, kmsg: Path, samples: int) -> dict[str, Any]:
    client = Http(proc.port)
    try:
        _, body = client.get("/metrics")
        text = body.decode()
        if not xid_wired(text):
            return {"status": "n/a (Xid subsystem not wired)"}
        buses = [kmsg_bus(bus) for _, bus in sorted(_GPU_INFO_RE.findall(text))]
        if not buses:
            return {"status": "n/a (no gpu_info pci_bus_id)"}
        seq, usec = 0, 3_600_000_000
        if kmsg.exists():
            for line in kmsg.read_text().splitlines():
                match = _KMSG_SEQ_RE.match(line)
                if match:
                    seq, usec = max(seq, int(match[1])), max(usec, int(match[2]))
        start_usec = usec
        t_base = time.monotonic()
        latencies, polls, timeouts = [], [], 0
        for i in range(samples):
            time.sleep(random.uniform(0.1, 0.6))  # spread writes over the sampler's phase
            _, body = client.get("/metrics")
            before = xid_total(body.decode())
            seq += 1
            usec = start_usec + int((time.monotonic() - t_base) * 1e6) + i
            record = (
                f"3,{seq},{usec},-;NVRM: Xid (PCI:{buses[i % len(buses)]}): {XID_CODE}, "
                f"pid={1234 + i}, name=python, Graphics Exception: bench {i}\n"
            )
            with kmsg.open("a") as f:
                f.write(record)
                f.flush()
            written = time.perf_counter()
            count = 0
            while True:
                _, body = client.get("/metrics")
                count += 1
                if xid_total(body.decode()) > before:
                    latencies.append((time.perf_counter() - written) * 1000)
                    break
                if time.perf_counter() - written > 5:
                    timeouts += 1
                    break
                time.sleep(0.001)
            polls.append(count)
    finally:
        client.close()
    ordered = sorted(latencies)
    return {
        "status": "ok" if ordered else "no Xid became visible within 5 s",
        "samples": len(ordered),
        "timeouts": timeouts,
        "p50_ms": percentile(ordered, 50) if ordered else None,
        "p99_ms": percentile(ordered, 99) if ordered else None,
        "max_ms": ordered[-1] if ordered else None,
        "polls_per_sample_p50": statistics.median(polls) if polls else None,
    }


def measure_latency(
    ports: dict[str, int], generator: str, cell_seconds: float, goal_repeats: int = 1
) -> dict[str, dict[str, dict[str, Any]]]:
    """``[server][f"{enc}/{conc}"] -> LoadResult``; servers interleaved within each cell.

    The goal cells (``GOAL_CONCURRENCY`` scrapers) are measured ``goal_repeats`` times, every
    server in turn each time, and the cell with the median p99 is kept (``median_cell``): a 3 s
    cell holds two to four of the exporter's 1 s sampling rounds, and the machine's speed drifts
    between cells: one cell's p99 moved 2x and more, for the exporter and the floor alike."""
    results: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in ports}
    for port in ports.values():  # warm-up: connections, caches, gzip of the current render
        client = Http(port)
        for headers in ({}, {"Accept-Encoding": "gzip"}):
            for _ in range(5):
                client.get("/metrics", headers)
        client.close()
    for gzip in (False, True):
        for conc in CONCURRENCY:
            key = f"{'gzip' if gzip else 'plain'}/{conc}"
            repeats = goal_repeats if conc == GOAL_CONCURRENCY else 1
            cells: dict[str, list[LoadResult]] = {name: [] for name in ports}
            for _ in range(repeats):
                for name, port in ports.items():
                    result = run_load(
                        generator, port, concurrency=conc, gzip=gzip, seconds=cell_seconds
                    )
                    cells[name].append(result)
                    log(
                        f"  {key:9} {name:8} p50 {result.p50_ms:8.3f} ms  p99 {result.p99_ms:8.3f}"
                        f" ms  {result.rps:8.0f} req/s  ({result.requests} requests,"
                        f" {result.errors} errors)"
                    )
            for name, measured in cells.items():
                results[name][key] = median_cell(measured)
    return results


def bench_shape(
    shape: str,
    profile: Profile,
    generator: str,
    skip_baselines: bool,
    skip: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    title, scenario = SHAPES[shape]
    out: dict[str, Any] = {"title": title, "scenario": str(scenario.relative_to(ROOT))}
    with tempfile.TemporaryDirectory(prefix=f"bench-{shape}-") as tmp:
        work = Path(tmp)
        (work / "state").mkdir()
        (work / "kmsg").touch()

        if "ready" not in skip:
            log(f"{shape}: time to /readyz ({profile.ready_runs} start(s))")
            out["ready"] = measure_ready(scenario, work, profile.ready_runs)

        meter = work / "sim-meter.json"
        command = [sys.executable, str(BENCH / "exporter_main.py"), *exporter_args(scenario, work)]
        exporter = start_gpu_exporter(command, {"BENCH_SIM_METER": str(meter)})
        baselines: list[Proc] = []
        try:
            wait_ready(exporter)
            # Sources that fill in after the first round (allocation polls, Xid replay): let them.
            time.sleep(2)
            client = Http(exporter.port)
            _, body = client.get("/metrics")
            client.close()
            exposition = work / "exposition.txt"
            exposition.write_bytes(body)
            out["exposition"] = {
                "bytes": len(body),
                "series": sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#")),
            }

            if "cpu" not in skip:
                log(
                    f"{shape}: whole-process CPU at default intervals ({profile.cpu_seconds:.0f} s)"
                )
                out["cpu"] = measure_cpu_share(exporter, meter, profile.cpu_seconds)

            if "xid" not in skip:
                log(f"{shape}: Xid latency ({profile.xid_samples} records)")
                out["xid"] = measure_xid(exporter, work / "kmsg", profile.xid_samples)

            if "latency" in skip:
                out["rss"] = {"exporter_peak_mib": proc_status_kib(exporter.pid, "VmHWM") / 1024}
                return out
            ports = {"exporter": exporter.port}
            ports_pids: dict[str, int] = {}
            if profile.paused:
                # The same exporter with sampling effectively off: the HTTP path alone, without the
                # sampler's (and the simulator's) CPU and GIL use in the background.
                paused_work = work / "paused"
                (paused_work / "state").mkdir(parents=True)
                (paused_work / "kmsg").touch()
                paused = start_gpu_exporter(
                    [
                        sys.executable,
                        "-m",
                        "gpu_exporter",
                        *exporter_args(scenario, paused_work),
                        *PAUSED_FLAGS,
                    ]
                )
                baselines.append(paused)
                wait_ready(paused)
                ports["paused"] = paused.port
                ports_pids["paused"] = paused.pid
            if not skip_baselines:
                proc = start_baseline("client", exposition)
                baselines.append(proc)
                ports["client"] = proc.port
                ports_pids["client"] = proc.pid
            log(f"{shape}: scrape latency ({generator}, {profile.cell_seconds:.0f} s per cell)")
            out["latency"] = measure_latency(
                ports, generator, profile.cell_seconds, profile.goal_repeats
            )
            out["rss"] = {
                "exporter_peak_mib": proc_status_kib(exporter.pid, "VmHWM") / 1024,
                "exporter_now_mib": proc_status_kib(exporter.pid, "VmRSS") / 1024,
                **{
                    f"{SERVER_TITLES[k]}_peak_mib": proc_status_kib(ports_pids[k], "VmHWM") / 1024
                    for k in ports_pids
                },
            }
        finally:
            for proc in baselines:
                proc.stop()
            exporter.stop()
    return out


def read_lag(proc: Proc, path: Path, previous_seq: int) -> dict[str, Any]:
    """The probe's lateness since its last dump (SIGUSR2, then the file with a newer sequence)."""
    os.kill(proc.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            data: dict[str, Any] = json.loads(path.read_text())
            if data["seq"] > previous_seq:
                return data
        time.sleep(0.005)
    raise RuntimeError("the loop-lag probe did not answer")


def measure_stall(
    shape: str, seconds: float, warmup_s: float = STALL_WARMUP_S, trace: Path | None = None
) -> dict[str, Any]:
    """The exporter under the loop-lag probe (loop_probe.py), scraped once a second as Prometheus
    scrapes (OpenMetrics, gzip, one kept connection) for ``seconds``: how late the probe's 10 ms
    timer woke, and how long the scrapes took, over that window (the first ``warmup_s`` after
    ``/readyz`` excluded). With ``trace``, the probe's stall trace of the window is written
    there (loop_probe.StallTrace)."""
    _, scenario = SHAPES[shape]
    with tempfile.TemporaryDirectory(prefix=f"bench-stall-{shape}-") as tmp:
        work = Path(tmp)
        (work / "state").mkdir()
        (work / "kmsg").touch()
        lag_file = work / "loop-lag.json"
        command = [sys.executable, str(BENCH / "loop_probe.py"), *exporter_args(scenario, work)]
        env = {LAG_ENV: str(lag_file)}
        if trace is not None:
            env[TRACE_ENV] = str(work / "trace.json")
        proc = start_gpu_exporter(command, env)
        try:
            wait_ready(proc)
            time.sleep(warmup_s)
            start = read_lag(proc, lag_file, 0)  # discards the start's wake-ups
            client = Http(proc.port)
            scrapes: list[float] = []
            begun = next_scrape = time.monotonic()
            while next_scrape < begun + seconds:
                time.sleep(max(0.0, next_scrape - time.monotonic()))
                t0 = time.perf_counter()
                status, _ = client.get("/metrics", PROMETHEUS_HEADERS)
                if status != 200:
                    raise RuntimeError(f"stall cell: /metrics answered {status}")
                scrapes.append((time.perf_counter() - t0) * 1000)
                next_scrape += 1.0
            client.close()
            lag = read_lag(proc, lag_file, start["seq"])
            elapsed = time.monotonic() - begun
            if trace is not None:
                trace.write_bytes((work / "trace.json").read_bytes())
        finally:
            proc.stop()
    ordered = sorted(scrapes)
    lag.pop("seq")
    return {
        "shape": shape,
        "seconds": round(elapsed, 1),
        "loop_lag": lag,
        "scrapes": {
            "count": len(ordered),
            "p50_ms": percentile(ordered, 50),
            "p99_ms": percentile(ordered, 99),
            "max_ms": ordered[-1],
        },
    }


def bench_sampler(shape: str, rounds: int) -> dict[str, Any]:
    """In a child process, so the simulator installed under pynvml never touches this one."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from gpu_exporter.logs import configure_logging; configure_logging('json', 'error');"
        "from sampler_cost import measure;"
        "print(json.dumps(measure(__import__('pathlib').Path(sys.argv[2]), int(sys.argv[3]))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(BENCH), str(SHAPES[shape][1]), str(rounds)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"sampler cost failed:\n{result.stderr[-2000:]}")
    data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


# --------------------------------------------------------------------------- report


def machine_info(generator: str) -> dict[str, Any]:
    wrk = ""
    if generator == "wrk":
        wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False).stdout
        wrk = wrk.splitlines()[0] if wrk else "wrk"
    return {**harness.machine_info(), "load_generator": wrk or "python asyncio raw-socket client"}


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def print_report(report: dict[str, Any]) -> None:
    m = report["machine"]
    print(
        f"\ngpu-exporter benchmark  {m['date']}  {m['cpu']} x{m['cpus']}  "
        f"python {m['python']}  {m['commit']}  load: {m['load_generator']}"
    )
    print(f"profile: {report['profile']}")
    for shape, data in report["shapes"].items():
        print(
            f"\n== {shape}: {data['title']}  "
            f"({data.get('exposition', {}).get('series', '?')} series, "
            f"{data.get('exposition', {}).get('bytes', 0) / 1024:.0f} KiB text)"
        )
        lat = data.get("latency")
        if lat:
            names = [n for n in SERVERS if n in lat]
            header = f"{'scrapers':>9} " + "".join(f"| {SERVER_TITLES[n]:>23} " for n in names)
            if "client" in lat:
                header += "| (a)/exp p99"
            print(header)
            print(f"{'':>9} " + "".join(f"| {'p50 ms':>11} {'p99 ms':>11} " for _ in names))
            for enc in ("plain", "gzip"):
                for conc in CONCURRENCY:
                    key = f"{enc}/{conc}"
                    row = f"{key:>9} " + "".join(
                        f"| {lat[n][key]['p50_ms']:>11.3f} {lat[n][key]['p99_ms']:>11.3f} "
                        for n in names
                    )
                    exp = lat["exporter"][key]["p99_ms"]
                    if "client" in lat:
                        row += f"| {lat['client'][key]['p99_ms'] / exp:>10.1f}x"
                    print(row)
        s = data.get("sampler")
        if s:
            print(
                f"sampler CPU per fast cycle: {s['exporter_cpu_ms_per_fast_round_p50']:.2f} ms "
                f"(total {s['fast_round_total_cpu_ms_p50']:.2f} - simulator "
                f"{s['simulator_cpu_ms_p50']:.2f} - metering; {s['nvml_calls_per_fast_round']:.0f} "
                f"NVML calls, render {s['render_cpu_ms_p50']:.2f} ms); slow cycle "
                f"{s['slow_round_exporter_cpu_ms_p50']:.2f} ms"
            )
        c = data.get("cpu")
        if c:
            print(
                f"process CPU at defaults: {c['share_percent_net']:.2f}% of a core "
                "net of simulator "
                f"({c['share_percent_raw']:.2f}% raw, over {c['wall_seconds']:.0f} s)"
            )
        r = data.get("rss")
        if r:
            print(
                f"peak RSS: {r['exporter_peak_mib']:.1f} MiB (baselines: "
                + ", ".join(
                    f"{k.removesuffix('_peak_mib')} {v:.1f}"
                    for k, v in r.items()
                    if k not in ("exporter_peak_mib", "exporter_now_mib")
                )
                + ")"
            )
        x = data.get("xid")
        if x:
            if x.get("p99_ms") is not None:
                print(
                    f"Xid kmsg -> /metrics: p50 {x['p50_ms']:.1f} ms, p99 {x['p99_ms']:.1f} ms "
                    f"(n={x['samples']}, timeouts {x['timeouts']})"
                )
            else:
                print(f"Xid kmsg -> /metrics: {x['status']}")
        rd = data.get("ready")
        if rd:
            print(
                f"start -> /readyz 200: p50 {rd['seconds_p50']:.2f} s, "
                f"max {rd['seconds_max']:.2f} s "
                f"(n={rd['runs']})"
            )
    if report.get("stall"):
        print(f"\n{stall_line(report['stall'])}")
    if report.get("peer"):
        peer = report["peer"]
        print(f"\nAgainst nvitop-exporter {peer['peer_version']} on {peer['scenario']}")
        print(peer_table(peer), end="")
    print("\nGoals")
    for g in report["goals"]:
        status = {True: "met", False: "MISSED", None: "n/a"}[g["met"]]
        note = f"  [{g['note']}]" if g["note"] else ""
        print(
            f"  {status:6} {g['goal']:58} {fmt(g['measured'])} {g['unit']} (<= {g['limit']}){note}"
        )


def stall_line(stall: dict[str, Any]) -> str:
    lag, scrapes = stall["loop_lag"], stall["scrapes"]
    return (
        f"event-loop stalls on {stall['shape']}, scraped every second for {stall['seconds']:.0f} s:"
        f" p50 {fmt(lag['p50_ms'])} ms, p99 {fmt(lag['p99_ms'])} ms, max {fmt(lag['max_ms'])} ms"
        f" ({lag['wakeups']} wake-ups of a {lag['interval_ms']:g} ms timer; at least 5 / 10 /"
        f" 20 ms late: {lag['at_least_ms']['5']} / {lag['at_least_ms']['10']} /"
        f" {lag['at_least_ms']['20']}); scrapes p50 {scrapes['p50_ms']:.2f} ms, p99"
        f" {scrapes['p99_ms']:.2f} ms, max {scrapes['max_ms']:.2f} ms{_full_collections(lag)}"
    )


def _full_collections(lag: dict[str, Any]) -> str:
    """How many full garbage collections fell in the window (reports from before the probe
    counted them have none)."""
    full = lag.get("collections", {}).get("2")
    return "" if full is None else f"; full garbage collections in the window: {full}"


def markdown(report: dict[str, Any]) -> str:
    """The results as Markdown tables (for docs/performance.md)."""
    out: list[str] = []
    for shape, data in report["shapes"].items():
        exp = data.get("exposition", {})
        out.append(
            f"### {shape}: {data['title']} ({exp.get('series', '?')} series, "
            f"{exp.get('bytes', 0) / 1024:.0f} KiB)\n"
        )
        lat = data.get("latency")
        if lat:
            names = [n for n in SERVERS if n in lat]
            out.append(
                "| scrapers | "
                + " | ".join(f"{SERVER_TITLES[n]} p50 / p99 ms" for n in names)
                + (" | (a) / exporter p99" if "client" in lat else "")
                + " |"
            )
            out.append("|---" * (1 + len(names) + ("client" in lat)) + "|")
            for enc in ("plain", "gzip"):
                for conc in CONCURRENCY:
                    key = f"{enc}/{conc}"
                    cells = [
                        f"{lat[n][key]['p50_ms']:.3f} / {lat[n][key]['p99_ms']:.3f}" for n in names
                    ]
                    e99 = lat["exporter"][key]["p99_ms"]
                    if "client" in lat:
                        cells.append(f"{lat['client'][key]['p99_ms'] / e99:.1f}x")
                    out.append(f"| {key} | " + " | ".join(cells) + " |")
            out.append("")
        rows = []
        if "sampler" in data:
            sm = data["sampler"]
            rows.append(
                f"sampler CPU per fast cycle {sm['exporter_cpu_ms_per_fast_round_p50']:.2f} ms "
                f"(simulator {sm['simulator_cpu_ms_p50']:.2f} ms subtracted, "
                f"{sm['nvml_calls_per_fast_round']:.0f} NVML calls, render "
                f"{sm['render_cpu_ms_p50']:.2f} ms); slow cycle "
                f"{sm['slow_round_exporter_cpu_ms_p50']:.2f} ms"
            )
        if "cpu" in data:
            c = data["cpu"]
            rows.append(
                f"process CPU at defaults {c['share_percent_net']:.2f}% of a core net of the "
                f"simulator ({c['share_percent_raw']:.2f}% raw)"
            )
        if "rss" in data:
            rows.append(f"peak RSS {data['rss']['exporter_peak_mib']:.1f} MiB")
        if "xid" in data:
            x = data["xid"]
            rows.append(
                f"Xid visible p50 {x['p50_ms']:.1f} ms, p99 {x['p99_ms']:.1f} ms (n={x['samples']})"
                if x.get("p99_ms") is not None
                else f"Xid: {x.get('status')}"
            )
        if "ready" in data:
            rd = data["ready"]
            rows.append(
                f"start to /readyz 200 p50 {rd['seconds_p50']:.2f} s, max {rd['seconds_max']:.2f} s"
            )
        out.extend(f"- {row}" for row in rows)
        out.append("")
    if report.get("stall"):
        out.append(f"### Event-loop stalls\n\n{stall_line(report['stall'])}\n")
    if report.get("peer"):
        peer = report["peer"]
        out.append(
            f"### Against nvitop-exporter {peer['peer_version']} on the same node "
            f"({peer['scenario']})\n"
        )
        out.append(peer_table(peer))
    out.append("| goal | measured | at most | | |")
    out.append("|---|---|---|---|---|")
    for g in report.get("goals", []):
        status = {True: "met", False: "**missed**", None: "n/a"}[g["met"]]
        out.append(
            f"| {g['goal']} | {fmt(g['measured'])} {g['unit']} | {g['limit']} {g['unit']} "
            f"| {status} | {g['note']} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="gpu-exporter benchmark (see bench/README.md)")
    parser.add_argument(
        "--quick", action="store_true", help="fewer requests: a ~2 minute smoke run"
    )
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help="comma list of: " + ", ".join(SHAPES)
    )
    parser.add_argument(
        "--client",
        choices=["auto", "wrk", "python"],
        default="auto",
        help="load generator (auto: wrk when on PATH)",
    )
    parser.add_argument("--cell-seconds", type=float, help="seconds per latency cell")
    parser.add_argument(
        "--goal-repeats",
        type=int,
        help="cells per server at 8 scrapers, the median p99's kept (full 5, --quick 1)",
    )
    parser.add_argument("--cpu-seconds", type=float, help="seconds of the whole-process CPU window")
    parser.add_argument(
        "--stall-seconds", type=float, help="seconds of the loop-lag window (full 300, --quick 20)"
    )
    parser.add_argument(
        "--stall-trace",
        type=Path,
        metavar="FILE",
        help="write the stall window's trace here: long callbacks, collections, late wake-ups",
    )
    parser.add_argument(
        "--stall-shape",
        default=goals.GOAL_SHAPE,
        choices=list(SHAPES),
        help="node shape of the loop-lag window",
    )
    parser.add_argument("--xid-samples", type=int, help="kernel-log records for the Xid latency")
    parser.add_argument("--no-baselines", action="store_true", help="measure the exporter only")
    parser.add_argument(
        "--paused",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also measure an exporter with sampling paused (default: on, off with --quick)",
    )
    parser.add_argument(
        "--skip", default="", help="comma list of parts to skip: " + ", ".join(PARTS)
    )
    parser.add_argument(
        "--exporter-args",
        default="",
        help="extra flags for every exporter process; use '=': --exporter-args='--no-kmsg'",
    )
    parser.add_argument(
        "--peer-shape",
        default="gpu8",
        choices=list(SHAPES),
        help="node shape of the nvitop-exporter comparison",
    )
    parser.add_argument(
        "--peer-before-src",
        type=Path,
        help="also run, in the peer comparison's windows, the exporter from this src/ directory",
    )
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "latest.json")
    parser.add_argument(
        "--markdown",
        type=Path,
        metavar="RESULTS.json",
        help="print an earlier run's results as Markdown tables and exit (measures nothing)",
    )
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())), end="")
        return 0

    base = QUICK if args.quick else FULL
    profile = Profile(
        cell_seconds=args.cell_seconds or base.cell_seconds,
        cpu_seconds=args.cpu_seconds or base.cpu_seconds,
        xid_samples=args.xid_samples or base.xid_samples,
        ready_runs=base.ready_runs,
        sampler_rounds=base.sampler_rounds,
        paused=base.paused if args.paused is None else args.paused,
        goal_repeats=args.goal_repeats or base.goal_repeats,
        stall_seconds=args.stall_seconds or base.stall_seconds,
    )
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; choose from {list(SHAPES)}")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - set(PARTS):
        parser.error(f"--skip: unknown part(s) {sorted(skip - set(PARTS))}; choose from {PARTS}")
    EXTRA_ARGS[:] = shlex.split(args.exporter_args)
    generator = pick_generator(args.client)
    started = time.monotonic()
    report: dict[str, Any] = {
        "machine": machine_info(generator),
        "profile": {"quick": args.quick, **profile.__dict__},
        "exporter_args": EXTRA_ARGS,
        "shapes": {},
    }
    for shape in shapes:
        data: dict[str, Any] = {}
        if "sampler" not in skip:
            log(f"{shape}: sampler CPU per cycle ({profile.sampler_rounds} rounds, in-process)")
            data["sampler"] = bench_sampler(shape, profile.sampler_rounds)
        data.update(bench_shape(shape, profile, generator, args.no_baselines, frozenset(skip)))
        report["shapes"][shape] = data
    if "stall" not in skip:
        log(f"stall: {args.stall_shape} under the loop-lag probe, {profile.stall_seconds:.0f} s")
        report["stall"] = measure_stall(
            args.stall_shape, profile.stall_seconds, trace=args.stall_trace
        )
    if "peer" not in skip:
        log(f"peer: gpu-exporter and nvitop-exporter on {args.peer_shape}, taking turns")
        peer_profile = PEER_QUICK if args.quick else PEER_FULL
        report["peer"] = compare(
            SHAPES[args.peer_shape][1], peer_profile, before_src=args.peer_before_src
        )
    report["goals"] = goals.judge(report)
    report["elapsed_seconds"] = round(time.monotonic() - started, 1)
    print_report(report)
    harness.write_json(args.out, report)
    print(
        f"\nwrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out} "
        f"in {report['elapsed_seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
