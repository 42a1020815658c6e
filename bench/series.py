"""Series per GPU at defaults: what a node costs the time-series store (issue 34).

    .venv/bin/python bench/series.py                      # built-in, mig56 and b200
    .venv/bin/python bench/series.py --shapes builtin --settle 35

For each node shape it starts the real exporter on the simulator with default flags, waits for
``/readyz`` and then until ``--settle`` seconds after the start (the allocation and Xid sources
fill in over the first rounds), scrapes ``/metrics`` once and prints the series (sample lines),
the GPUs (``gpu_info``: whole GPUs, MIG instances are not counted as GPUs) and series per GPU,
node-level series included. The largest families follow, for where the series go.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.harness import Http, exporter_args, start_exporter, wait_ready  # noqa: E402

SHAPES: dict[str, Path | None] = {
    "builtin": None,  # gpu-exporter --simulate: 8x H100, two in MIG mode, pods, NVSwitches
    "mig56": BENCH / "scenarios" / "mig56.yaml",
    "b200": BENCH / "scenarios" / "b200.yaml",
}


def count(body: str) -> dict[str, Any]:
    """Series, GPUs and the families with the most series, from one exposition."""
    names: Counter[str] = Counter()
    for line in body.splitlines():
        if line and not line.startswith("#"):
            names[line.split("{", 1)[0].split(" ", 1)[0]] += 1
    series = sum(names.values())
    gpus = names["gpu_info"]
    return {
        "series": series,
        "gpus": gpus,
        "per_gpu": round(series / gpus, 1) if gpus else None,
        "largest": names.most_common(12),
    }


def measure(shape: str, settle: float) -> dict[str, Any]:
    scenario = SHAPES[shape]
    with tempfile.TemporaryDirectory(prefix=f"series-{shape}-") as tmp:
        work = Path(tmp)
        (work / "state").mkdir()
        (work / "kmsg").touch()
        args = exporter_args(scenario or Path("-"), work)
        if scenario is None:
            args.remove("-")  # --simulate without a file: the built-in node
        exporter = start_exporter([sys.executable, "-m", "gpu_exporter", *args])
        try:
            wait_ready(exporter)
            time.sleep(max(0.0, settle - (time.perf_counter() - exporter.started)))
            client = Http(exporter.port)
            _, body = client.get("/metrics")
            client.close()
        finally:
            exporter.stop()
    return count(body.decode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated")
    parser.add_argument("--settle", type=float, default=35.0, help="seconds after the start")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    results = {}
    for shape in args.shapes.split(","):
        result = results[shape] = measure(shape, args.settle)
        print(
            f"{shape}: {result['series']} series, {result['gpus']} GPUs, "
            f"{result['per_gpu']} series per GPU"
        )
        print("  largest: " + ", ".join(f"{name} {n}" for name, n in result["largest"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
