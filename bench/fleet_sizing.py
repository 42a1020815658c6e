"""What the kit costs a store, by fleet size: ``make fleet-sizing`` (bench/fleet_sizing.py).

For each variant (the exporter's defaults, and with the opt-in detail flags) it starts the fleet
replay of ``make fleet`` (demo/fleet.py) for the largest size, and for each size N a fresh
VictoriaMetrics single-node, vmagent scraping the first N nodes every 15 s (remote write) and
vmalert evaluating the kit's rule files every 1 min (``keep_firing_for`` stripped: Debian's 1.79
refuses it). After a warm-up it measures, over the measurement window:

- active series and samples per second ingested (scraped and recorded);
- the store's RSS and CPU, and its disk per day (data size after a flush, per sample ingested,
  times samples per day);
- every rule group's evaluation time on vmalert (mean and max over the window), against a fifth
  of its own interval (the group's ``interval``, else vmalert's 1 min);
- every group's work: its rules' expressions run one at a time as instant queries after the
  window, summed (what the group costs the store with nothing else queued beside it);
- the machine's load average over each measurement (``os.getloadavg``), so that a group over its
  limit only because other work shared the cores can be told from one that is;
- every dashboard query (Grafana variables as for a 1 h range, every selector variable "All") as
  a range query over the window, twice each: p50, p99 and the slowest, against 500 ms.

It prints a table with linear fits to 1,000 and 5,000 nodes and writes JSON (default
``bench/results/fleet-sizing.json``). docs/operations.md "Sizing table" has the last run. A
benchmark: goals are reported, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml  # noqa: E402
from demo.fleet import Fleet  # noqa: E402
from demo.stack import (  # noqa: E402
    RULE_FILES,
    VictoriaMetricsProcess,
    VmagentProcess,
    VmalertProcess,
    find_binary,
    load_yaml,
    stop_all,
    wait_ready,
    without_keep_firing_for,
)
from harness import machine_info, proc_cpu_seconds, proc_status_kib, write_json  # noqa: E402

DASHBOARDS = ROOT / "dashboards"
DETAIL_FLAGS = ("--collector.nvlink.per-link",)
SCRAPE_INTERVAL = "15s"
EVALUATION_INTERVAL = "1m"
QUERY_LIMIT_S = 0.5
# Grafana's variables for a 1 h dashboard range at 15 s scrapes; selectors are "All".
DASHBOARD_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range_s": "3600",
    "$__range": "1h",
}
_DURATION = {"s": 1, "m": 60, "h": 3600}
PARTS = ("small", "big")


@dataclass
class Cell:
    """One fleet size of one variant."""

    variant: str
    nodes: int
    series: int = 0
    series_per_node: dict[str, int] = field(default_factory=dict)  # by shape
    samples_per_s: float = 0.0
    store_rss_mib: float = 0.0
    store_cores: float = 0.0
    disk_mib_per_day: float = 0.0
    vmagent_rss_mib: float = 0.0
    groups: dict[str, dict[str, float]] = field(default_factory=dict)
    # Per group: the sum and slowest of its rules run one at a time, and its interval.
    group_work: dict[str, dict[str, Any]] = field(default_factory=dict)
    load_average: list[float] = field(default_factory=list)  # 1-min load: start, end of window
    query_p50_s: float = 0.0
    query_p99_s: float = 0.0
    slowest_queries: list[tuple[float, str, str]] = field(default_factory=list)
    slowest_rules: list[tuple[float, str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def seconds(duration: str) -> float:
    return float(duration[:-1]) * _DURATION[duration[-1]]


def http_json(url: str, timeout: float = 60.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read().decode())


def http_get(url: str, timeout: float = 60.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return bytes(response.read())


def scrape_metrics(url: str) -> dict[str, float]:
    """A /metrics page as {'name{labels}': value} (the binaries' own self-metrics)."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                try:
                    out[key] = float(value)
                except ValueError:
                    continue
    return out


def total(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k == prefix or k.startswith(prefix + "{"))


def single_values(store: str, dashboard: dict[str, Any]) -> dict[str, str]:
    """A value for each variable without "All" (the node of the node dashboard): the first of
    its label_values(metric, label) in the store, as Grafana would preselect."""
    values = {}
    for variable in dashboard["templating"]["list"]:
        if variable.get("type") != "query" or variable.get("includeAll", True):
            continue
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
        if match is None:
            continue
        params = urllib.parse.urlencode({"match[]": match.group(1)})
        found = http_json(f"{store}/api/v1/label/{match.group(2)}/values?{params}")["data"]
        if found:
            values[variable["name"]] = sorted(found)[0]
    return values


def dashboard_queries(store: str) -> list[tuple[str, str, str, bool]]:
    """(dashboard, panel, query, instant) of every panel target: Grafana's variables for a 1 h
    range, a node chosen where the dashboard has no "All", every other selector "All"; instant
    for a table or stat that asks for the last value only, as Grafana sends it."""
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        chosen = single_values(store, dashboard)
        panels = []
        for panel in dashboard["panels"]:
            panels += [panel, *panel.get("panels", [])]
        for panel in panels:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for variable, value in DASHBOARD_VARIABLES.items():
                    expr = expr.replace(variable, value)
                for name, value in chosen.items():
                    expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
                expr = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)
                found.append((path.stem, panel["title"], expr, bool(target.get("instant"))))
    return found


def time_queries(store: str, window_s: float, repeats: int = 3) -> list[tuple[float, str, str]]:
    """(seconds, dashboard, panel) of every dashboard query, ``repeats`` times each: a range
    query over the window, or an instant query where the panel asks for one."""
    end = time.time()
    timings = []
    for _ in range(repeats):
        for dashboard, title, expr, instant in dashboard_queries(store):
            if instant:
                url = f"{store}/api/v1/query?" + urllib.parse.urlencode(
                    {"query": expr, "time": end}
                )
            else:
                params = {"query": expr, "start": end - window_s, "end": end, "step": 15}
                url = f"{store}/api/v1/query_range?" + urllib.parse.urlencode(params)
            started = time.perf_counter()
            try:
                http_json(url)
            except OSError as exc:
                print(f"  query failed: {dashboard}: {title}: {exc}", file=sys.stderr)
            timings.append((time.perf_counter() - started, dashboard, title))
    return timings


def group_durations(vmalert_url: str) -> dict[str, dict[str, float]]:
    """Per rule group: vmalert's mean iteration since its start and its slowest over its
    summary's window (the last 5 minutes: with the default warm-up and window, the measured
    window and the end of the warm-up, not the first evaluations, which meet a store still
    registering every new series). Its rules API's per-rule evaluationTime is no measure: it
    reads far above the group's own iteration time."""
    metrics = scrape_metrics(vmalert_url)
    groups: dict[str, dict[str, float]] = {}
    pattern = re.compile(r"vmalert_iteration_duration_seconds(_sum|_count|)\{(.*)\}")
    for key, value in metrics.items():
        match = pattern.fullmatch(key)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        entry = groups.setdefault(labels["group"], {})
        if match.group(1):
            entry[match.group(1)[1:]] = value
        elif labels.get("quantile") == "1":
            entry["max_s"] = value
    return {
        name: {
            "mean_s": entry.get("sum", 0.0) / entry["count"] if entry.get("count") else 0.0,
            "max_s": entry.get("max_s", 0.0),
            "runs": entry.get("count", 0.0),
        }
        for name, entry in sorted(groups.items())
    }


def slowest_rules(vmalert_url: str, count: int = 8) -> list[tuple[float, str, str]]:
    """(seconds, group, rule) of the rules whose last evaluation took longest."""
    groups = http_json(f"{vmalert_url}/api/v1/rules")["data"]["groups"]
    timed = [
        (float(rule.get("evaluationTime", 0.0)), group["name"], rule["name"])
        for group in groups
        for rule in group["rules"]
    ]
    return sorted(timed, reverse=True)[:count]


def group_intervals(paths: list[Path]) -> dict[str, float]:
    """Each group's evaluation interval in seconds (its own, else vmalert's)."""
    return {
        group["name"]: seconds(group.get("interval", EVALUATION_INTERVAL))
        for path in paths
        for group in load_yaml(path)["groups"]
    }


def group_work(store: str, paths: list[Path]) -> dict[str, dict[str, Any]]:
    """Per group: its rules' expressions as instant queries, one at a time (what vmalert asks
    the store), summed, with the slowest rule: a group's evaluation time with nothing queued
    beside it."""
    intervals = group_intervals(paths)
    out: dict[str, dict[str, Any]] = {}
    for path in paths:
        for group in load_yaml(path)["groups"]:
            spent, slowest, each = 0.0, (0.0, ""), {}
            for rule in group["rules"]:
                url = f"{store}/api/v1/query?" + urllib.parse.urlencode({"query": rule["expr"]})
                started = time.perf_counter()
                try:
                    http_json(url)
                except OSError as exc:
                    print(f"  rule failed: {group['name']}: {exc}", file=sys.stderr)
                took = time.perf_counter() - started
                spent += took
                each[rule.get("record") or rule["alert"]] = round(took, 4)
                slowest = max(slowest, (took, rule.get("record") or rule["alert"]))
            out[group["name"]] = {
                "serial_s": spent,
                "slowest_rule": list(slowest),
                "interval_s": intervals[group["name"]],
                "rules_s": each,
            }
    return out


def rule_files(workdir: Path) -> list[Path]:
    paths = []
    for source in RULE_FILES:
        path = workdir / source.name
        path.write_text(yaml.safe_dump(without_keep_firing_for(load_yaml(source)), sort_keys=False))
        paths.append(path)
    return paths


async def measure(
    fleet: Fleet, variant: str, nodes: int, args: argparse.Namespace, workdir: Path
) -> Cell:
    cell = Cell(variant, nodes)
    targets = workdir / "targets.json"
    await asyncio.to_thread(write_json, targets, fleet.file_sd()[:nodes])
    scrape = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": "10s"},
        "scrape_configs": [
            {"job_name": "gpu-exporter", "file_sd_configs": [{"files": [str(targets)]}]}
        ],
    }
    store = VictoriaMetricsProcess(args.victoria_metrics, workdir / "victoria")
    processes: list[Any] = [store]
    try:
        await asyncio.to_thread(wait_ready, f"{store.url}/health", store)
        vmagent = VmagentProcess(
            args.vmagent, scrape, f"{store.url}/api/v1/write", workdir / "vmagent"
        )
        processes.append(vmagent)
        sink = f"http://127.0.0.1:{args.sink_port}"
        vmalert = VmalertProcess(
            args.vmalert,
            rule_files(workdir),
            store.url,
            sink,
            workdir / "vmalert",
            evaluation_interval=EVALUATION_INTERVAL,
        )
        processes.append(vmalert)
        await asyncio.to_thread(wait_ready, f"{vmagent.url}/-/ready", vmagent)
        await asyncio.to_thread(wait_ready, f"{vmalert.url}/health", vmalert)
        print(f"[{variant} {nodes}] warming up {args.warmup:.0f}s", flush=True)
        await asyncio.sleep(args.warmup)
        before = await asyncio.to_thread(scrape_metrics, store.url)
        cpu_before = proc_cpu_seconds(store.process.pid)
        cell.load_average = [os.getloadavg()[0]]
        started = time.monotonic()
        print(f"[{variant} {nodes}] measuring {args.window:.0f}s", flush=True)
        await asyncio.sleep(args.window)
        elapsed = time.monotonic() - started
        cell.load_average.append(os.getloadavg()[0])
        after = await asyncio.to_thread(scrape_metrics, store.url)
        cell.store_cores = (proc_cpu_seconds(store.process.pid) - cpu_before) / elapsed
        rows = total(after, "vm_rows_inserted_total") - total(before, "vm_rows_inserted_total")
        cell.samples_per_s = rows / elapsed
        cell.series = int(total(after, 'vm_cache_entries{type="storage/hour_metric_ids"}'))
        cell.store_rss_mib = proc_status_kib(store.process.pid, "VmRSS") / 1024
        cell.vmagent_rss_mib = proc_status_kib(vmagent.process.pid, "VmRSS") / 1024
        cell.groups = await asyncio.to_thread(group_durations, vmalert.url)
        cell.slowest_rules = await asyncio.to_thread(slowest_rules, vmalert.url)
        for process in (store, vmagent, vmalert):
            if not process.alive():
                cell.errors.append(f"{process.name} exited: {process.output(5)}")
        # vmalert stopped first: the rules' work is timed on a store that only ingests.
        await asyncio.to_thread(vmalert.stop)
        cell.group_work = await asyncio.to_thread(group_work, store.url, list(RULE_FILES))
        timings = await asyncio.to_thread(time_queries, store.url, args.window, args.query_repeats)
        durations = sorted(t for t, _, _ in timings)
        cell.query_p50_s = statistics.median(durations)
        cell.query_p99_s = durations[min(len(durations) - 1, int(0.99 * len(durations)))]
        cell.slowest_queries = sorted(timings, reverse=True)[:5]
        await asyncio.to_thread(http_get, f"{store.url}/internal/force_flush")
        flushed = await asyncio.to_thread(scrape_metrics, store.url)
        # Samples cost their parts' bytes each; the index is written again every day for every
        # active series (VictoriaMetrics' per-day index), so it counts once per day.
        sample_bytes = sum(
            flushed.get(f'vm_data_size_bytes{{type="storage/{kind}"}}', 0.0) for kind in PARTS
        )
        stored = sum(flushed.get(f'vm_rows{{type="storage/{kind}"}}', 0.0) for kind in PARTS)
        index_bytes = flushed.get('vm_data_size_bytes{type="indexdb"}', 0.0)
        if stored:
            per_day = sample_bytes / stored * cell.samples_per_s * 86400 + index_bytes
            cell.disk_mib_per_day = per_day / 2**20
        cell.series_per_node = {shape: count for shape, count in fleet.series_per_node().items()}
    finally:
        await asyncio.to_thread(stop_all, reversed(processes))
    return cell


def fit(cells: list[Cell], value: Any, nodes: int) -> float:
    """A least-squares line through (N, value) at ``nodes``."""
    xs = [c.nodes for c in cells]
    ys = [float(value(c)) for c in cells]
    if len(xs) < 2:
        return ys[0] * nodes / xs[0]
    slope, intercept = statistics.linear_regression(xs, ys)
    return slope * nodes + intercept


def interval_s(cell: Cell, group: str) -> float:
    interval = cell.group_work.get(group, {}).get("interval_s", seconds(EVALUATION_INTERVAL))
    return float(interval)


def limit_s(cell: Cell, group: str) -> float:
    """A fifth of the group's interval: the goal for its evaluation."""
    return interval_s(cell, group) / 5


def worst_share(cell: Cell) -> float:
    """The largest evaluation time of a group as a share of its interval (goal: 0.2)."""
    return max((g["max_s"] / interval_s(cell, n) for n, g in cell.groups.items()), default=0.0)


def slowest_alone(cell: Cell) -> float:
    return max((g["serial_s"] for g in cell.group_work.values()), default=0.0)


def load(cell: Cell) -> float:
    return max(cell.load_average, default=0.0)


# (heading, format, value, extrapolated): the load is the machine's, not the fleet's.
COLUMNS: tuple[tuple[str, str, Any, bool], ...] = (
    ("series", "{:,.0f}", lambda c: c.series, True),
    ("samples/s", "{:,.0f}", lambda c: c.samples_per_s, True),
    ("store RSS MiB", "{:,.0f}", lambda c: c.store_rss_mib, True),
    ("store cores", "{:.2f}", lambda c: c.store_cores, True),
    ("disk MiB/day", "{:,.0f}", lambda c: c.disk_mib_per_day, True),
    (
        "slowest group s",
        "{:.2f}",
        lambda c: max((g["max_s"] for g in c.groups.values()), default=0),
        True,
    ),
    ("worst group / interval", "{:.2f}", worst_share, True),
    ("slowest group alone s", "{:.2f}", slowest_alone, True),
    ("query p99 s", "{:.3f}", lambda c: c.query_p99_s, True),
    ("load", "{:.1f}", load, False),
)


def table(cells: list[Cell], extrapolate: tuple[int, ...]) -> str:
    lines = [
        "| variant | nodes | " + " | ".join(name for name, *_ in COLUMNS) + " |",
        "|---|---:|" + "---:|" * len(COLUMNS),
    ]
    for variant in dict.fromkeys(c.variant for c in cells):
        measured = [c for c in cells if c.variant == variant]
        for cell in measured:
            row = [fmt.format(get(cell)) for _, fmt, get, _ in COLUMNS]
            lines.append(f"| {variant} | {cell.nodes:,} | " + " | ".join(row) + " |")
        for nodes in extrapolate:
            row = [
                fmt.format(fit(measured, get, nodes)) if fitted else ""
                for _, fmt, get, fitted in COLUMNS
            ]
            lines.append(f"| {variant} | {nodes:,} (fit) | " + " | ".join(row) + " |")
    return "\n".join(lines)


def group_table(cells: list[Cell]) -> str:
    """Per rule group: its interval, then for each measured size its slowest evaluation on
    vmalert and, after a slash, its rules run alone (seconds)."""
    measured = [c for c in cells if c.groups]
    names = sorted({name for c in measured for name in c.groups})
    heads = [f"{c.variant} {c.nodes:,}" for c in measured]
    lines = [
        "| group | interval | " + " | ".join(heads) + " |",
        "|---|---:|" + "---:|" * len(heads),
    ]
    for name in names:
        interval = max((interval_s(c, name) for c in measured), default=0.0)
        row = []
        for cell in measured:
            slowest = cell.groups.get(name, {}).get("max_s", 0.0)
            alone = cell.group_work.get(name, {}).get("serial_s", 0.0)
            row.append(f"{slowest:.2f} / {alone:.2f}")
        lines.append(f"| `{name}` | {interval:.0f} s | " + " | ".join(row) + " |")
    return "\n".join(lines)


def goals(cells: list[Cell]) -> list[str]:
    out = []
    for cell in cells:
        slow = {
            name: f"{group['max_s']:.1f}s of {limit_s(cell, name):.0f}s (alone: "
            f"{cell.group_work.get(name, {}).get('serial_s', 0.0):.1f}s)"
            for name, group in cell.groups.items()
            if group["max_s"] > limit_s(cell, name)
        }
        queries = [(round(t, 3), d, p) for t, d, p in cell.slowest_queries if t > QUERY_LIMIT_S]
        verdict = "met" if not slow and not queries else "MISSED"
        load = "-".join(f"{value:.1f}" for value in cell.load_average)
        out.append(
            f"{cell.variant} {cell.nodes} (load {load}): {verdict} (groups over a fifth of their "
            f"interval: {slow or 'none'}; queries over {QUERY_LIMIT_S * 1000:.0f} ms: "
            f"{queries or 'none'})"
        )
    return out


async def run(args: argparse.Namespace) -> list[Cell]:
    from aiohttp import web

    async def sink(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/api/v2/alerts", sink)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    args.sink_port = runner.addresses[0][1]
    cells = []
    try:
        for variant in args.variants:
            workdir = Path(tempfile.mkdtemp(prefix=f"gx-sizing-{variant}-"))
            extra = DETAIL_FLAGS if variant == "detail" else ()
            fleet = Fleet(max(args.sizes), workdir / "fleet", exporter_args=extra)
            await fleet.start()
            try:
                print(f"[{variant}] series per node: {fleet.series_per_node()}", flush=True)
                for nodes in args.sizes:
                    cells.append(await measure(fleet, variant, nodes, args, workdir / str(nodes)))
                    shutil.rmtree(workdir / str(nodes), ignore_errors=True)
                    print(table([cells[-1]], ()), flush=True)
            finally:
                await fleet.stop()
                shutil.rmtree(workdir, ignore_errors=True)
    finally:
        await runner.cleanup()
    return cells


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[150, 300, 600])
    parser.add_argument("--variants", nargs="+", default=["defaults", "detail"])
    parser.add_argument("--warmup", type=float, default=150.0, help="seconds before measuring")
    parser.add_argument("--window", type=float, default=180.0, help="seconds measured")
    parser.add_argument("--query-repeats", type=int, default=2, help="runs of each query")
    parser.add_argument("--extrapolate", type=int, nargs="*", default=[1000, 5000])
    parser.add_argument("--output", type=Path, default=ROOT / "bench/results/fleet-sizing.json")
    parser.add_argument(
        "--report",
        type=Path,
        nargs="+",
        help="print the tables of earlier runs' JSON files, measuring nothing",
    )
    args = parser.parse_args()
    if args.report:
        earlier = [Cell(**c) for path in args.report for c in json.loads(path.read_text())["cells"]]
        print(table(earlier, tuple(args.extrapolate)))
        print(group_table(earlier))
        for line in goals(earlier):
            print(line)
        return 0
    for name in ("victoria-metrics", "vmagent", "vmalert"):
        path = find_binary(name)
        if path is None:
            parser.error(f"{name} is not installed (make system-deps)")
        setattr(args, name.replace("-", "_"), path)
    cells = asyncio.run(run(args))
    print(table(cells, tuple(args.extrapolate)))
    print(group_table(cells))
    for line in goals(cells):
        print(line)
    for cell in cells:
        print(f"{cell.variant} {cell.nodes}: slowest rules {cell.slowest_rules[:5]}")
        alone = sorted(cell.group_work.items(), key=lambda item: -item[1]["serial_s"])
        worst = [(n, round(w["serial_s"], 2), w["slowest_rule"]) for n, w in alone[:6]]
        print(f"{cell.variant} {cell.nodes}: groups alone {worst}")
    write_json(
        args.output,
        {
            "machine": machine_info(),
            "settings": {
                "scrape_interval": SCRAPE_INTERVAL,
                "evaluation_interval": EVALUATION_INTERVAL,
                "warmup_s": args.warmup,
                "window_s": args.window,
                "detail_flags": DETAIL_FLAGS,
            },
            "cells": [asdict(cell) for cell in cells],
            "table": table(cells, tuple(args.extrapolate)),
            "groups": group_table(cells),
            "goals": goals(cells),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
