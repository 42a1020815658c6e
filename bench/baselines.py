"""The baseline (a), serving the exporter's series from a separate process.

``python bench/baselines.py client EXPOSITION.txt`` - (a) "the usual way": a ``prometheus_client``
custom collector that yields the same series as Gauge/CounterMetricFamily objects on every
scrape (the families are parsed once from the exporter's exposition; each scrape rebuilds them and
runs ``generate_latest``), served by aiohttp through ``prometheus_client.aiohttp``'s handler
(which also negotiates OpenMetrics and gzip).

It listens on 127.0.0.1 (``--port``, default ephemeral) and prints ``PORT <n>`` on stdout when
ready.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- (a) prometheus_client


class ReplayCollector:
    """Yields the parsed exposition's series as fresh metric families on every collect()."""

    def __init__(self, text: str) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        self._families: list[tuple[str, str, str, list[str], list[tuple[list[str], float]]]] = []
        for family in text_string_to_metric_families(text):
            if family.type not in ("gauge", "counter"):
                raise SystemExit(f"unexpected family type {family.type} for {family.name}")
            label_names: list[str] = []
            for sample in family.samples:
                for key in sample.labels:
                    if key not in label_names:
                        label_names.append(key)
            rows = [
                ([sample.labels.get(key, "") for key in label_names], sample.value)
                for sample in family.samples
                if not sample.name.endswith("_created")
            ]
            self._families.append(
                (family.type, family.name, family.documentation, label_names, rows)
            )

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for kind, name, documentation, label_names, rows in self._families:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            metric = cls(name, documentation, labels=label_names)
            for values, value in rows:
                metric.add_metric(values, value)
            yield metric


def serve_client(text: str, port: int) -> None:
    from aiohttp import web
    from prometheus_client import CollectorRegistry
    from prometheus_client.aiohttp import make_aiohttp_handler

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReplayCollector(text))

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/metrics", make_aiohttp_handler(registry))
        runner = web.AppRunner(app, access_log=None, handle_signals=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        bound = runner.addresses[0][1]
        print(f"PORT {bound}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["client"])
    parser.add_argument("exposition", type=Path)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    text = args.exposition.read_text()
    try:
        serve_client(text, args.port)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
