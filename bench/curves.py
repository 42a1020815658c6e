"""How the exporter's cost grows: devices, holders (pods) and scrapers, as a table and plots.

    .venv/bin/python bench/curves.py --quick          # ~4 min on a 2-core machine
    .venv/bin/python bench/curves.py --out bench/results/curves.json --plots docs/images

Each point is the real exporter process at default intervals on a generated scenario (through
``exporter_main.py``, so the simulator and the simulated kubelet are metered and subtracted):

- **devices**: 1, 8 and 16 whole H100s, one allocated workload each, and 8 H100 x 7 ``1g.10gb``
  (64 devices: 8 GPUs and 56 MIG instances, 100 pods); with ``--full`` also 16 H100 x 7 (128
  devices, 200 pods), the node the docs quote;
- **holders**: the 64-device MIG node with 0, 25, 50 and 100 pods holding instances;
- **scrapers**: 8 whole GPUs, 1 to 64 closed-loop keep-alive scrapers (p99 and the process's CPU).

Per point: idle CPU share net of the simulator (no scrapes), sampler CPU per fast round
(``sampler_cost.measure`` in a child, simulator subtracted), scrape p99 at 8 scrapers (1 s) and
peak RSS. The fitted slope is an ordinary least-squares line through the points.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from harness import BENCH, ROOT, log, machine_info, proc_cpu_seconds, proc_status_kib, write_json
from loadgen import pick_generator, run_load
from peer import OURS, start_ours
from scenarios.generate import mig_node, whole_gpus


@dataclass(frozen=True)
class CurveProfile:
    idle_seconds: float
    sampler_rounds: int
    load_seconds: float
    big_node: bool  # also measure 16 x 7 MIG (128 devices)


CURVES_QUICK = CurveProfile(idle_seconds=6, sampler_rounds=8, load_seconds=1, big_node=False)
CURVES_FULL = CurveProfile(idle_seconds=20, sampler_rounds=30, load_seconds=2, big_node=True)
SCRAPERS = (1, 8, 16, 32, 64)
HOLDERS = (0, 25, 50, 100)


def mig_node_with(gpus: int, holders: int | None) -> dict[str, Any]:
    """The bench's MIG node (7x 1g.10gb per H100) on ``gpus`` GPUs, its first ``holders`` pods."""
    base = mig_node()
    scenario: dict[str, Any] = copy.deepcopy(base)
    scenario["gpus"] = [copy.deepcopy(base["gpus"][0]) for _ in range(gpus)]
    if gpus > 8:  # repeat the 8-GPU layout of pods on the next GPUs, with their own names
        for block in range(1, gpus // 8):
            for key in ("workloads", "allocations"):
                for item in base[key]:
                    extra = {
                        **item,
                        "gpu": item["gpu"] + 8 * block,
                        "pod": f"{item['pod']}-{block}",
                    }
                    if key == "workloads":
                        extra["pid"] = item["pid"] + 1000 * block
                    scenario[key].append(extra)
    if holders is not None:
        pods = sorted({w["pod"] for w in scenario["workloads"]})[:holders]
        scenario["workloads"] = [w for w in scenario["workloads"] if w["pod"] in pods]
        scenario["allocations"] = [a for a in scenario["allocations"] if a["pod"] in pods]
    return scenario


def points(profile: CurveProfile) -> list[tuple[str, str, float, dict[str, Any]]]:
    """(sweep, label, x, scenario) for every point of the device and holder sweeps."""
    out: list[tuple[str, str, float, dict[str, Any]]] = []
    for count in (1, 8, 16):
        scenario = whole_gpus(f"curve-gpu{count}", "H100-SXM-80GB", count, "60GiB")
        out.append(("devices", f"{count} GPUs", count, scenario))
    out.append(("devices", "8 GPUs x 7 MIG", 64, mig_node_with(8, None)))
    if profile.big_node:
        out.append(("devices", "16 GPUs x 7 MIG", 128, mig_node_with(16, None)))
    for holders in HOLDERS:
        out.append(("holders", f"{holders} pods", holders, mig_node_with(8, holders)))
    return out


def sampler_cpu(scenario: Path, rounds: int) -> dict[str, Any]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from gpu_exporter.logs import configure_logging; configure_logging('json', 'error');"
        "from sampler_cost import measure;"
        "print(json.dumps(measure(__import__('pathlib').Path(sys.argv[2]), int(sys.argv[3]))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(BENCH), str(scenario), str(rounds)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=True,
    )
    data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


def measure_point(
    scenario: dict[str, Any], work: Path, profile: CurveProfile, generator: str
) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    path = work / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    sampler = sampler_cpu(path, profile.sampler_rounds)
    server = start_ours(OURS, path, work / "exporter", [])
    try:
        time.sleep(3)  # sources that fill in after the first round
        w0, c0, n0, _ = server.snapshot()
        time.sleep(profile.idle_seconds)
        w1, c1, n1, _ = server.snapshot()
        idle = 100 * max(0.0, (c1 - c0) - (n1 - n0) / 1e9) / (w1 - w0)
        load = run_load(
            generator, server.port, concurrency=8, gzip=False, seconds=profile.load_seconds
        )
        rss = proc_status_kib(server.proc.pid, "VmHWM") / 1024
    finally:
        server.proc.stop()
    return {
        "devices": sampler["devices"],
        "series": sampler["series"],
        "idle_cpu_percent_net": idle,
        "sampler_cpu_ms_per_fast_round": sampler["exporter_cpu_ms_per_fast_round_p50"],
        "scrape_p99_ms_at_8": load.p99_ms,
        "peak_rss_mib": rss,
    }


def measure_scrapers(work: Path, profile: CurveProfile, generator: str) -> list[dict[str, Any]]:
    work.mkdir(parents=True, exist_ok=True)
    path = work / "gpu8.yaml"
    path.write_text(
        yaml.safe_dump(whole_gpus("curve-gpu8", "H100-SXM-80GB", 8, "60GiB"), sort_keys=False)
    )
    server = start_ours(OURS, path, work / "scrapers", [])
    rows = []
    try:
        time.sleep(3)
        for conc in SCRAPERS:
            c0, w0 = proc_cpu_seconds(server.proc.pid), time.perf_counter()
            load = run_load(
                generator, server.port, concurrency=conc, gzip=False, seconds=profile.load_seconds
            )
            c1, w1 = proc_cpu_seconds(server.proc.pid), time.perf_counter()
            rows.append(
                {
                    "scrapers": conc,
                    "scrape_p99_ms": load.p99_ms,
                    "scrapes_per_second": load.rps,
                    "process_cpu_percent": 100 * (c1 - c0) / (w1 - w0),
                    "rss_mib": proc_status_kib(server.proc.pid, "VmRSS") / 1024,
                }
            )
            log(f"  {conc:3} scrapers: p99 {load.p99_ms:.2f} ms")
    finally:
        server.proc.stop()
    return rows


def slope(xs: list[float], ys: list[float]) -> float:
    if len(set(xs)) < 2:
        return float("nan")
    return float(statistics.linear_regression(xs, ys).slope)


def fits(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Least-squares slopes: per device, per pod, per scraper."""
    out: dict[str, dict[str, float]] = {}
    for sweep in ("devices", "holders"):
        rows = result[sweep]
        xs = [r["x"] for r in rows]
        out[sweep] = {
            key: slope(xs, [r[key] for r in rows])
            for key in (
                "idle_cpu_percent_net",
                "sampler_cpu_ms_per_fast_round",
                "scrape_p99_ms_at_8",
                "peak_rss_mib",
            )
        }
    rows = result["scrapers"]
    xs = [float(r["scrapers"]) for r in rows]
    out["scrapers"] = {
        key: slope(xs, [r[key] for r in rows]) for key in ("scrape_p99_ms", "rss_mib")
    }
    return out


def table(result: dict[str, Any]) -> str:
    lines = [
        "| sweep | point | devices | series | idle CPU % net | sampler ms/round "
        "| p99 @8 ms | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sweep in ("devices", "holders"):
        for r in result[sweep]:
            lines.append(
                f"| {sweep} | {r['label']} | {r['devices']} | {r['series']} "
                f"| {r['idle_cpu_percent_net']:.2f} | {r['sampler_cpu_ms_per_fast_round']:.2f} "
                f"| {r['scrape_p99_ms_at_8']:.2f} | {r['peak_rss_mib']:.1f} |"
            )
    lines += [
        "",
        "| scrapers | p99 ms | scrapes/s | process CPU % | RSS MiB |",
        "|---|---|---|---|---|",
    ]
    for r in result["scrapers"]:
        lines.append(
            f"| {r['scrapers']} | {r['scrape_p99_ms']:.2f} | {r['scrapes_per_second']:.0f} "
            f"| {r['process_cpu_percent']:.1f} | {r['rss_mib']:.1f} |"
        )
    lines += ["", "| sweep | fitted slope |", "|---|---|"]
    units = {"devices": "per device", "holders": "per pod", "scrapers": "per scraper"}
    for sweep, values in result["fits"].items():
        cells = ", ".join(f"{k} {v:+.4f}" for k, v in values.items())
        lines.append(f"| {sweep} ({units[sweep]}) | {cells} |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], directory: Path) -> list[Path]:
    """One PNG per sweep (matplotlib, a dev dependency), each panel with its fitted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    panels = {
        "devices": ("devices", "x"),
        "holders": ("pods holding MIG instances (64 devices)", "x"),
    }
    keys = (
        ("idle_cpu_percent_net", "idle CPU, % of a core (net)"),
        ("sampler_cpu_ms_per_fast_round", "sampler CPU ms / fast round"),
        ("scrape_p99_ms_at_8", "scrape p99 ms @8"),
        ("peak_rss_mib", "peak RSS MiB"),
    )
    for sweep, (xlabel, xkey) in panels.items():
        rows = result[sweep]
        fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
        for ax, (key, title) in zip(axes, keys, strict=True):
            xs, ys = [r[xkey] for r in rows], [r[key] for r in rows]
            ax.plot(xs, ys, "o", label="measured")
            if len(set(xs)) > 1:
                line = statistics.linear_regression(xs, ys)
                ends = [min(xs), max(xs)]
                ax.plot(ends, [line.intercept + line.slope * x for x in ends], "--", label="fit")
            fitted = result["fits"][sweep][key]
            ax.set_title(f"{title}\nslope {fitted:+.4f}", fontsize=9)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        path = directory / f"cost-{sweep}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    rows = result["scrapers"]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, (key, title) in zip(
        axes,
        (("scrape_p99_ms", "scrape p99 ms"), ("process_cpu_percent", "process CPU %")),
        strict=True,
    ):
        ax.plot([r["scrapers"] for r in rows], [r[key] for r in rows], "o-")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("keep-alive scrapers (8 GPUs)", fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = directory / "cost-scrapers.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)
    return written


def run(profile: CurveProfile, client: str = "auto") -> dict[str, Any]:
    generator = pick_generator(client)
    result: dict[str, Any] = {
        "machine": {**machine_info(), "load_generator": generator},
        "profile": profile.__dict__,
        "devices": [],
        "holders": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-curves-") as tmp:
        work = Path(tmp)
        for i, (sweep, label, x, scenario) in enumerate(points(profile)):
            log(f"curves: {sweep} {label}")
            row = measure_point(scenario, work / str(i), profile, generator)
            result[sweep].append({"label": label, "x": x, **row})
        log("curves: scrapers")
        result["scrapers"] = measure_scrapers(work, profile, generator)
    result["fits"] = fits(result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cost curves (see the module docstring)")
    parser.add_argument("--quick", action="store_true", help="short windows, no 128-device node")
    parser.add_argument("--client", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "curves.json")
    parser.add_argument("--plots", type=Path, help="write cost-*.png into this directory")
    parser.add_argument("--markdown", type=Path, metavar="CURVES.json", help="print a run's table")
    parser.add_argument(
        "--replot", type=Path, metavar="CURVES.json", help="draw a run's plots into --plots"
    )
    args = parser.parse_args(argv)
    if args.markdown:
        print(table(json.loads(args.markdown.read_text())), end="")
        return 0
    if args.replot:
        for path in plot(json.loads(args.replot.read_text()), args.plots or Path(".")):
            print(f"wrote {path}")
        return 0
    result = run(CURVES_QUICK if args.quick else CURVES_FULL, args.client)
    print(table(result), end="")
    write_json(args.out, result)
    if args.plots:
        for path in plot(result, args.plots):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
