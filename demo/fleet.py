"""``python -m demo.fleet`` (``make fleet N=...``): N GPU nodes on loopback, replayed from real
simulated exporters, to size a time-series store for a fleet.

One real ``gpu-exporter --simulate`` runs per node shape (:data:`SHAPES`: the built-in 8x H100
node, bench's ``mig56`` node of 56 MIG devices, an 8x B200 HGX node and a 4x GB200 NVL72 tray);
one aiohttp server replays them as N nodes, node ``i`` having shape ``i % 4``. A node's exposition
is its shape's latest ``/metrics``, byte for byte, with the node's identity relabelled: GPU and MIG
UUIDs, serials, PCI domains, pod names and, on GB200 trays, the fabric's cluster UUID (every 18
trays are one rack: one NVLink domain of 72 GPUs). Values are the real exporter's, so every node
of a shape reports the same activity.

Every node is a path of one port (``/nodes/<node>/metrics``); the targets are written as a
Prometheus ``file_sd`` file whose groups set ``__metrics_path__``, ``instance`` and ``node``, which
Prometheus, a Prometheus agent and vmagent all read (docs/operations.md "Sizing your store").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import re
import signal
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from .stack import DEMO, ROOT, STARTUP_LIMIT, ExporterProcess, stop_all

TRAYS_PER_RACK = 18  # GB200 NVL72: 18 compute trays of 4 GPUs share one NVLink domain
FLEET_NAMESPACE = uuid.UUID("6f1c2f5e-8d0b-4c43-9a55-3c1f0e7a9b21")  # seeds relabelled UUIDs
ZERO_UUID = "00000000-0000-0000-0000-000000000000"  # an HGX fabric's "no cluster"
IDENTITY = re.compile(r'\b(uuid|parent_uuid|serial|pci_bus_id|pod|cluster_uuid)="([^"]*)"')
# The exporters sample at their defaults: a fleet replays what a production node serves.
EXPORTER_ARGS = ("--fast-interval=1s", "--slow-interval=30s")


@dataclass(frozen=True)
class Shape:
    name: str
    scenario: Path | None  # None: the built-in scenario


SHAPES = (
    Shape("h100", None),
    Shape("mig56", ROOT / "bench" / "scenarios" / "mig56.yaml"),
    Shape("b200", DEMO / "scenarios" / "fleet-b200.yaml"),
    Shape("gb200", DEMO / "scenarios" / "fleet-gb200.yaml"),
)


@dataclass(frozen=True)
class Node:
    """One replayed node: ``ordinal`` counts the nodes of its shape (GB200 racks follow it)."""

    index: int
    shape: Shape
    ordinal: int

    @property
    def name(self) -> str:
        return f"gpu-node-{self.index:05d}"

    @property
    def path(self) -> str:
        return f"/nodes/{self.name}/metrics"

    def relabel(self, label: str, value: str) -> str:
        """This node's value of an identity label whose value on the source node is ``value``."""
        if label in ("uuid", "parent_uuid"):
            prefix, _, _ = value.partition("-")
            return f"{prefix}-{uuid.uuid5(FLEET_NAMESPACE, f'{self.name}/{value}')}"
        if label == "serial":
            digest = int(hashlib.sha256(f"{self.name}/{value}".encode()).hexdigest(), 16)
            return str(digest)[: len(value)]
        if label == "pci_bus_id" and value[8:9] == ":":
            return f"{self.index:08X}{value[8:]}"  # a PCI domain per node
        if label == "pod":
            return f"{value}-{self.index:05d}"
        if label == "cluster_uuid" and value != ZERO_UUID:
            rack = self.ordinal // TRAYS_PER_RACK
            return str(uuid.uuid5(FLEET_NAMESPACE, f"{self.shape.name}-rack-{rack}"))
        return value


def plan(nodes: int) -> list[Node]:
    """``nodes`` nodes, their shapes taking turns."""
    return [
        Node(index, SHAPES[index % len(SHAPES)], index // len(SHAPES)) for index in range(nodes)
    ]


@dataclass(frozen=True)
class Template:
    """A source exposition cut at its identity label values: literals and slots alternate."""

    literals: tuple[str, ...]  # one more than slots
    slots: tuple[tuple[str, str], ...]  # (label, value) in order of appearance
    content_type: str
    series: int

    @classmethod
    def parse(cls, text: str, content_type: str) -> Template:
        parts = IDENTITY.split(text)
        literals = tuple(parts[0::3])
        slots = tuple(zip(parts[1::3], parts[2::3], strict=True))
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        return cls(literals, slots, content_type, series)

    def render(self, node: Node) -> bytes:
        replaced = {slot: f'{slot[0]}="{node.relabel(*slot)}"' for slot in set(self.slots)}
        values = [replaced[slot] for slot in self.slots]
        pieces = chain.from_iterable(zip(self.literals[:-1], values, strict=True))
        return ("".join(pieces) + self.literals[-1]).encode()


@dataclass
class _Source:
    """A shape's exporter and its latest exposition; rendered nodes are kept until it changes."""

    exporter: ExporterProcess
    template: Template | None = None
    rendered: dict[int, bytes] = field(default_factory=dict)


class Fleet:
    """The exporters of :data:`SHAPES` and one aiohttp server replaying them as ``nodes`` nodes."""

    def __init__(
        self,
        nodes: int,
        workdir: Path,
        *,
        exporter_args: Sequence[str] = (),
        refresh: float = 5.0,
    ) -> None:
        self.nodes = plan(nodes)
        self.by_name = {node.name: node for node in self.nodes}
        self.workdir = workdir
        self.exporter_args = (*EXPORTER_ARGS, *exporter_args)
        self.refresh = refresh
        self.sources: dict[str, _Source] = {}
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        shapes = {node.shape.name: node.shape for node in self.nodes}
        try:
            for shape in shapes.values():
                exporter = ExporterProcess(
                    shape.name, shape.scenario, self.workdir / shape.name, self.exporter_args
                )
                self.sources[shape.name] = _Source(exporter)
            for source in self.sources.values():
                await asyncio.to_thread(source.exporter.wait_listening)
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
            for source in self.sources.values():
                await self._wait_ready(source)
                await self._fetch(source)
            self._tasks = [
                asyncio.create_task(self._keep_fresh(source)) for source in self.sources.values()
            ]
            app = web.Application()
            app.router.add_get("/nodes/{name}/metrics", self._serve)
            app.router.add_get("/-/ready", self._ready)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, host, port)
            await site.start()
            self.port = int(self._runner.addresses[0][1])
            self.host = host
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        await asyncio.to_thread(stop_all, [s.exporter for s in self.sources.values()])

    async def _wait_ready(self, source: _Source, limit: float = STARTUP_LIMIT) -> None:
        """Until the exporter's first samples are in (``/readyz``)."""
        assert self._session is not None
        deadline = asyncio.get_running_loop().time() + limit
        url = f"http://{source.exporter.address}/readyz"
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with self._session.get(url) as response:
                    if response.status == 200:
                        return
            if asyncio.get_running_loop().time() > deadline or not source.exporter.alive():
                raise RuntimeError(
                    f"exporter {source.exporter.name} not ready:\n{source.exporter.output()}"
                )
            await asyncio.sleep(0.2)

    async def _fetch(self, source: _Source) -> None:
        assert self._session is not None
        async with self._session.get(f"http://{source.exporter.address}/metrics") as response:
            response.raise_for_status()
            text = await response.text()
            content_type = response.headers.get("Content-Type", "text/plain; version=0.0.4")
        # Cutting a 400 kB exposition takes tens of milliseconds: not on the serving loop.
        source.template = await asyncio.to_thread(Template.parse, text, content_type)
        source.rendered = {}

    async def _keep_fresh(self, source: _Source) -> None:
        while True:
            await asyncio.sleep(self.refresh)
            try:
                await self._fetch(source)
            except (aiohttp.ClientError, TimeoutError) as exc:
                # Keep serving the last exposition: a scrape of a replayed node never fails
                # because its source was slow once.
                print(f"fleet: {source.exporter.name}: {exc!r}", file=sys.stderr)

    async def _serve(self, request: web.Request) -> web.Response:
        node = self.by_name.get(request.match_info["name"])
        if node is None:
            raise web.HTTPNotFound(text=f"no node {request.match_info['name']!r} in this fleet\n")
        source = self.sources[node.shape.name]
        assert source.template is not None
        body = source.rendered.get(node.index)
        if body is None:
            body = await asyncio.to_thread(source.template.render, node)
            source.rendered[node.index] = body
        return web.Response(body=body, headers={"Content-Type": source.template.content_type})

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(text="ready\n")

    def file_sd(self) -> list[dict[str, Any]]:
        """Prometheus ``file_sd`` target groups, one per node."""
        return [
            {
                "targets": [f"{self.host}:{self.port}"],
                "labels": {
                    "__metrics_path__": node.path,
                    "instance": f"{node.name}:9445",
                    "node": node.name,
                },
            }
            for node in self.nodes
        ]

    def series_per_node(self) -> dict[str, int]:
        """Series in each shape's exposition (a node of that shape serves as many)."""
        return {
            name: source.template.series
            for name, source in self.sources.items()
            if source.template is not None
        }

    def total_series(self) -> int:
        per_shape = self.series_per_node()
        return sum(per_shape[node.shape.name] for node in self.nodes)


async def _serve_until_stopped(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="gx-fleet-"))
    fleet = Fleet(args.nodes, workdir, exporter_args=args.exporter_arg, refresh=args.refresh)
    host, _, port = args.listen.rpartition(":")
    await fleet.start(host, int(port))
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    try:
        args.file_sd.write_text(json.dumps(fleet.file_sd(), indent=1) + "\n")
        per_shape = ", ".join(f"{n} {s}" for n, s in fleet.series_per_node().items())
        print(
            f"fleet: {len(fleet.nodes)} nodes on http://{fleet.host}:{fleet.port}/nodes/<node>/metrics"
            f"\n  series per node: {per_shape}; about {fleet.total_series():,} in all"
            f"\n  targets (file_sd): {args.file_sd.resolve()}"
            "\n  Ctrl-C stops",
            flush=True,
        )
        await stopped.wait()
    finally:
        await fleet.stop()


def main(argv: Sequence[str] | None = None) -> int:
    description = __doc__.splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m demo.fleet", description=description)
    parser.add_argument("--nodes", type=int, default=50, help="nodes to serve (default 50)")
    parser.add_argument(
        "--listen", default="127.0.0.1:9700", help="HOST:PORT of the replay server (port 0: any)"
    )
    parser.add_argument(
        "--file-sd",
        type=Path,
        default=Path("fleet-targets.json"),
        help="where to write the Prometheus file_sd targets (default ./fleet-targets.json)",
    )
    parser.add_argument(
        "--refresh", type=float, default=5.0, help="seconds between reads of the sources"
    )
    parser.add_argument(
        "--exporter-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="a flag for every source exporter, e.g. --exporter-arg=--collector.nvlink.per-link",
    )
    args = parser.parse_args(argv)
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    asyncio.run(_serve_until_stopped(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
