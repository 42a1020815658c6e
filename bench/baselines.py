"""The two baselines, each serving the exporter's series from a separate process.

``python bench/baselines.py client EXPOSITION.txt`` - (a) "the usual way": a ``prometheus_client``
custom collector that yields the same series as Gauge/CounterMetricFamily objects on every
scrape (the families are parsed once from the exporter's exposition; each scrape rebuilds them and
runs ``generate_latest``), served by aiohttp through ``prometheus_client.aiohttp``'s handler
(which also negotiates OpenMetrics and gzip).

``python bench/baselines.py raw EXPOSITION.txt`` - (b) the floor: a minimal asyncio protocol that
answers every request on a keep-alive connection with the same bytes (gzip level 1 when asked,
compressed once up front) and a minimal HTTP/1.1 header.

Both listen on 127.0.0.1 (``--port``, default ephemeral) and print ``PORT <n>`` on stdout when
ready.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TEXT_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


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


# --------------------------------------------------------------------------- (b) raw asyncio


class RawProtocol(asyncio.Protocol):
    def __init__(self, plain: bytes, gzipped: bytes) -> None:
        self._plain = plain
        self._gzipped = gzipped
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head, self._buffer = self._buffer[:end], self._buffer[end + 4 :]
            wants_gzip = _accepts_gzip(head)
            assert self._transport is not None
            self._transport.write(self._gzipped if wants_gzip else self._plain)


def _accepts_gzip(head: bytes) -> bool:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"accept-encoding":
            return b"gzip" in value.lower()
    return False


def _response(body: bytes, *, gzipped: bool) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: " + TEXT_CONTENT_TYPE + b"\r\n"
    if gzipped:
        head += b"Content-Encoding: gzip\r\n"
    return head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body


def serve_raw(text: str, port: int) -> None:
    raw = text.encode()
    plain = _response(raw, gzipped=False)
    gzipped = _response(gzip.compress(raw, compresslevel=1, mtime=0), gzipped=True)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: RawProtocol(plain, gzipped), "127.0.0.1", port, reuse_address=True
        )
        print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
        await server.serve_forever()

    asyncio.run(main())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["client", "raw"])
    parser.add_argument("exposition", type=Path)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    text = args.exposition.read_text()
    try:
        (serve_client if args.kind == "client" else serve_raw)(text, args.port)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
