"""Builds the running exporter from a frozen :class:`Config` (the one place that wires parts)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .config import Config
from .logs import get_logger
from .nvml import WorkerPool
from .sampler import Sampler
from .server import make_web_app

_log = get_logger("app")


@dataclass
class Exporter:
    """The parts of a running exporter, started and stopped together."""

    config: Config
    pool: WorkerPool
    sampler: Sampler
    web_app: web.Application
    simulation: Any = None  # a SimulatedNode under --simulate
    runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with ``--listen 127.0.0.1:0``)."""
        if self.runner is None or not self.runner.addresses:
            raise RuntimeError("exporter is not listening")
        return int(self.runner.addresses[0][1])

    async def start(self) -> None:
        await self.sampler.start()
        self.runner = web.AppRunner(self.web_app, access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.config.listen_host, self.config.listen_port)
        await site.start()
        _log.info("listening", address=f"{self.config.listen_host}:{self.port}")

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        await self.sampler.stop()
        self.pool.shutdown()
        if self.simulation is not None:
            from .simulator import uninstall

            self.simulation.close()
            uninstall()


def build_exporter(config: Config) -> Exporter:
    """Wire every part from ``config``; nothing starts until :meth:`Exporter.start`."""
    pool = WorkerPool(size=_pool_size())
    simulation = None
    extra_routes: Iterable[web.RouteDef] = ()
    if config.simulator is not None:
        simulation, extra_routes = _start_simulation(config)
    sampler = Sampler(config, pool)
    web_app = make_web_app(sampler, extra_routes)
    return Exporter(config, pool, sampler, web_app, simulation)


def _pool_size() -> int:
    # NVML releases the GIL; a few threads keep 8-64 devices' calls overlapping.
    return max(4, min(16, (os.cpu_count() or 2) * 2))


def _start_simulation(config: Config) -> tuple[Any, Iterable[web.RouteDef]]:
    from .simulator import SimulatedNode, install, load_scenario
    from .simulator.control import make_routes

    assert config.simulator is not None
    scenario = load_scenario(config.simulator.scenario)
    node = SimulatedNode(scenario)
    install(node)
    return node, make_routes(node)


async def run_until_signalled(exporter: Exporter) -> None:
    """Run until SIGTERM or SIGINT, then stop everything cleanly."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await exporter.start()
        await stop.wait()
        _log.info("shutting down")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with suppress(Exception):
                loop.remove_signal_handler(signum)
        await exporter.stop()
