"""Test helpers: a manual clock, a simulated sampler driven round by round, exposition parsing."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.app import Exporter, build_exporter, sampler_settings
from gpu_exporter.cli import host_for, parse_config
from gpu_exporter.collectors import Cadence, collector_names
from gpu_exporter.config import Config
from gpu_exporter.dcgm.readings import DcgmLink
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.migprofiles import MigProfileBook
from gpu_exporter.nvml import ErrorCounter, WorkerPool
from gpu_exporter.sampler import Sampler
from gpu_exporter.simulator import SimulatedNode, install, loads_scenario, uninstall
from gpu_exporter.simulator.host import SimulatedHost, simulated_host

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


class ManualClock:
    """A monotonic clock that moves only when told to (shared by simulator and sampler)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def parse_exposition(text: str) -> Series:
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return series


def select(series: Series, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """Every series of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return {key: v for (n, key), v in series.items() if n == name and wanted <= key}


def one(series: Series, name: str, **labels: str) -> float:
    found = select(series, name, **labels)
    assert len(found) == 1, f"expected one {name}{labels}, found {len(found)}: {sorted(found)}"
    return next(iter(found.values()))


@dataclass(frozen=True)
class SharedState:
    """What the composition root (``app.build_exporter``) creates and hands to the sampler and
    to the parts that read what it writes: tests wire the same way."""

    ledger: ActivityLedger = field(default_factory=ActivityLedger)
    mig_profiles: MigProfileBook = field(default_factory=MigProfileBook)
    errors: ErrorCounter = field(default_factory=ErrorCounter)
    dcgm: DcgmLink = field(default_factory=DcgmLink)

    def sampler(self, config: Config, pool: WorkerPool, **options: Any) -> Sampler:
        return Sampler(
            sampler_settings(config),
            pool,
            ledger=self.ledger,
            mig_profiles=self.mig_profiles,
            errors=self.errors,
            dcgm=self.dcgm,
            **options,
        )


def drained(series: Series, reason: str, **labels: str) -> float:
    """``gpu_drain_recommended`` for ``reason`` on the device ``labels`` pick: 1 while it stands,
    else 0 (the device then serves no series for it: one without a reason, at 0, if none stands)."""
    found = select(series, "gpu_drain_recommended", reason=reason, **labels)
    assert len(found) <= 1, f"{reason}{labels}: {sorted(found)}"
    assert found or select(series, "gpu_drain_recommended", **labels), f"no drain series: {labels}"
    return next(iter(found.values()), 0.0)


@dataclass
class SimulatedSampler:
    sampler: Sampler
    node: SimulatedNode
    clock: ManualClock
    sampler_pool: WorkerPool
    shared: SharedState

    async def fast_round(self, seconds: float = 1.0) -> Series:
        self.clock.advance(seconds)
        await self.sampler.sample_round(Cadence.FAST)
        return self.series()

    async def slow_round(self) -> Series:
        await self.sampler.sample_round(Cadence.SLOW)
        return self.series()

    def series(self) -> Series:
        """Everything the last render holds: the served exposition and the families only the
        status page reads (``served=False``; tests/core/test_served.py keeps them off /metrics);
        as a scrape does, the sampler is told it was read."""
        self.sampler.note_read()
        exposition = self.sampler.exposition
        return parse_exposition((exposition.text + exposition.unserved).decode())

    def served(self) -> Series:
        """What ``/metrics`` serves."""
        self.sampler.note_read()
        return parse_exposition(self.sampler.exposition.text.decode())

    def inject(self, event: Mapping[str, Any]) -> None:
        self.node.inject(event)


def make_config(*flags: str, **overrides: Any) -> Config:
    """Every collector on, on a loopback port; ``flags`` give the collectors' options, parsed as
    the command line's are."""
    base = Config(
        listen_host="127.0.0.1",
        listen_port=0,
        collectors=frozenset(collector_names()),
        collector_options=parse_config(flags, environ={}).collector_options,
    )
    return replace(base, **overrides)


@asynccontextmanager
async def simulated_sampler(
    scenario: str, *flags: str, **config: Any
) -> AsyncIterator[SimulatedSampler]:
    """A started sampler on a simulated node with a manual clock; no background loops.
    ``flags``: collector options as typed (``--collector.nvlink.per-link``)."""
    clock = ManualClock()
    node = SimulatedNode(loads_scenario(textwrap.dedent(scenario), "<test>"), clock=clock)
    install(node)
    pool = WorkerPool(size=4)
    shared = SharedState()
    sampler = shared.sampler(make_config(*flags, **config), pool, clock=clock)
    try:
        await sampler.start(background=False)
        yield SimulatedSampler(sampler, node, clock, pool, shared)
    finally:
        await sampler.stop()
        pool.shutdown()
        node.close()
        uninstall()


def simulated_exporter(config: Config) -> tuple[Exporter, SimulatedHost]:
    """The whole exporter built from ``config`` (``--simulate``'s) on the simulated node, which
    the test drives (events, hangs, the kubelet) as the simulator's control API would."""
    simulated = simulated_host(config)
    return build_exporter(config, simulated.host), simulated


@asynccontextmanager
async def running_exporter(config: Config) -> AsyncIterator[Exporter]:
    """The whole exporter built from ``config`` as the CLI builds it, started, with its first
    fast round rendered."""
    async with started(build_exporter(config, host_for(config))) as exporter:
        yield exporter


@asynccontextmanager
async def running_simulation(config: Config) -> AsyncIterator[tuple[Exporter, SimulatedHost]]:
    """:func:`running_exporter` on the simulated node, handed to the test beside it."""
    exporter, simulated = simulated_exporter(config)
    async with started(exporter):
        yield exporter, simulated


@asynccontextmanager
async def started(exporter: Exporter) -> AsyncIterator[Exporter]:
    await exporter.start()
    try:
        await exporter.sampler.wait_for_rounds(Cadence.FAST, 1)
        yield exporter
    finally:
        await exporter.stop()
