"""What the exporter promotes to the garbage collector's old generation, by type and by where.

``python bench/promotions.py [--shape mig56] [--seconds 120] [--sites]`` runs the exporter on a
bench shape (``--simulate``, default intervals), scraped once a second as Prometheus scrapes,
and counts, from ``--warmup`` seconds after ``/readyz`` to the end, every object that a
generation-1 collection moved into generation 2: the objects of the young generations that were
still alive when it ran.

Why it matters: CPython (3.11-3.13) runs a full collection, which traverses every tracked object
with the GIL held (30-60 ms on ``mig56``, most of it the imported modules), once the objects
promoted since the last one exceed a quarter of the old generation. On ``mig56`` that is about
18,000 promotions; under about 50 a second, none falls in the stall cell's 5 minutes. What is
alive at a generation-1 collection is mostly round state, so this names the round state that
is not yet untracked (strings, numbers, exact tuples of them) or reused from round to round.

``--sites`` also starts ``tracemalloc`` in the exporter and names each promoted object's
innermost ``gpu_exporter`` frame (slower: startup takes longer, so give it a longer
``--warmup``). The counting runs in a collector callback installed from outside the product
(``--child``, like loop_probe.py); it lists the young generations at each generation-1
collection, so it is a diagnostic, never part of a timed cell.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Http, exporter_args, start_gpu_exporter, wait_ready

BENCH = Path(__file__).resolve().parent
SHAPES = ("gpu8", "mig56", "gpu16")
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    "Accept-Encoding": "gzip",
}
COUNT_ENV = "BENCH_PROMOTIONS"  # where the child writes its counts on SIGUSR1
SITES_ENV = "BENCH_PROMOTION_SITES"


class PromotionCounter:
    """Counts what each generation-1 collection promotes, once :meth:`start` is called."""

    def __init__(self, target: Path, sites: bool) -> None:
        self.target = target
        self.sites = sites
        self.counting_since: float | None = None
        self.young: dict[int, Any] | None = None
        self.collections = {1: 0, 2: 0}
        self.types: Counter[str] = Counter()
        self.where: Counter[str] = Counter()

    def start(self) -> None:
        self.counting_since = time.monotonic()
        self.collections = {1: 0, 2: 0}
        self.types.clear()
        self.where.clear()

    def on_collection(self, phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if self.counting_since is None or generation == 0:
            return
        if phase == "start":
            if generation == 1:
                self.young = {id(o): o for o in gc.get_objects(0) + gc.get_objects(1)}
            return
        self.collections[generation] += 1
        young, self.young = self.young, None
        if generation != 1 or young is None:
            return
        for survivor in gc.get_objects(2):
            if young.get(id(survivor)) is survivor:
                kind = type(survivor).__qualname__
                self.types[kind] += 1
                if self.sites:
                    self.where[f"{kind} @ {_site(survivor)}"] += 1

    def dump(self, *_: object) -> None:
        seconds = time.monotonic() - (self.counting_since or time.monotonic())
        promoted = sum(self.types.values())
        data = {
            "seconds": round(seconds, 1),
            "generation_1_collections": self.collections[1],
            "full_collections": self.collections[2],
            "promoted": promoted,
            "promoted_per_s": round(promoted / seconds, 1) if seconds else None,
            "types": self.types.most_common(40),
            "sites": self.where.most_common(60),
        }
        tmp = self.target.with_name(self.target.name + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.target)


def _site(obj: object) -> str:
    """The innermost gpu_exporter frame that allocated ``obj`` (else the innermost frame)."""
    traceback = tracemalloc.get_object_traceback(obj)
    if traceback is None:
        return "?"
    ours = [frame for frame in traceback if "gpu_exporter" in frame.filename]
    frame = (ours or list(traceback))[-1]
    return f"{frame.filename.rsplit('gpu_exporter/', 1)[-1]}:{frame.lineno}"


def child(exporter_flags: list[str]) -> None:
    """The exporter (``gpu_exporter.cli.main``) with the counter installed; SIGUSR2 starts the
    count (after the warm-up), SIGUSR1 writes it."""
    sites = os.environ.get(SITES_ENV) == "1"
    if sites:
        tracemalloc.start(10)
    counter = PromotionCounter(Path(os.environ[COUNT_ENV]), sites)
    gc.callbacks.append(counter.on_collection)
    signal.signal(signal.SIGUSR2, lambda *_: counter.start())
    signal.signal(signal.SIGUSR1, counter.dump)
    from gpu_exporter import cli

    sys.argv = ["gpu-exporter", *exporter_flags]
    cli.main()


def measure(shape: str, seconds: float, warmup: float, sites: bool) -> dict[str, Any]:
    scenario = BENCH / "scenarios" / f"{shape}.yaml"
    with tempfile.TemporaryDirectory(prefix=f"bench-promotions-{shape}-") as tmp:
        work = Path(tmp)
        (work / "state").mkdir()
        (work / "kmsg").touch()
        counts = work / "promotions.json"
        command = [sys.executable, __file__, "--child", *exporter_args(scenario, work)]
        env = {COUNT_ENV: str(counts), SITES_ENV: "1" if sites else "0"}
        proc = start_gpu_exporter(command, env)
        try:
            wait_ready(proc)
            time.sleep(warmup)
            proc.popen.send_signal(signal.SIGUSR2)
            client = Http(proc.port)
            begun = next_scrape = time.monotonic()
            while next_scrape < begun + seconds:
                time.sleep(max(0.0, next_scrape - time.monotonic()))
                client.get("/metrics", PROMETHEUS_HEADERS)
                next_scrape += 1.0
            client.close()
            proc.popen.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 10
            while not counts.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            return dict(json.loads(counts.read_text()))
        finally:
            proc.stop()


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="mig56")
    parser.add_argument("--seconds", type=float, default=120.0, help="the counted window")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds after /readyz")
    parser.add_argument("--sites", action="store_true", help="name allocation sites too")
    args = parser.parse_args()
    report = measure(args.shape, args.seconds, args.warmup, args.sites)
    collections = report["generation_1_collections"]
    print(
        f"{args.shape}, {report['seconds']:.0f} s scraped every second: {report['promoted']}"
        f" objects promoted ({report['promoted_per_s']} a second) by {collections}"
        f" generation-1 collections; full collections: {report['full_collections']}"
    )
    for kind, n in report["types"][:25]:
        print(f"  {n:7d}  {kind}")
    for site, n in report["sites"][:40]:
        print(f"  {n / max(collections, 1):7.0f} per collection  {site}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
