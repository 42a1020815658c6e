"""Regenerate the status page screenshot in the README and docs (``make screenshot``).

The built-in simulated node, with an application Xid on the time-sliced GPU and a hardware Xid on
GPU 2 injected so the drain and the Xid table show, photographed by headless Chromium.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import aiohttp

from gpu_exporter.app import build_exporter
from gpu_exporter.cli import host_for
from gpu_exporter.collectors import Cadence
from gpu_exporter.config import SimulatorConfig
from tests.helpers import make_config
from tests.status.browser import screenshot

EVENTS = ({"type": "xid", "gpu": 4, "code": 13}, {"type": "xid", "gpu": 2, "code": 48})


async def photograph(path: Path) -> None:
    config = make_config(simulator=SimulatorConfig(), fast_interval=0.5, slow_interval=1.0)
    exporter = build_exporter(config, host_for(config))
    await exporter.start()
    try:
        await exporter.sampler.wait_for_rounds(Cadence.FAST, 3)
        async with aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session:
            for event in EVENTS:
                async with session.post("/-/simulator/events", json=event) as reply:
                    reply.raise_for_status()
        await exporter.sampler.wait_for_rounds(Cadence.SLOW, 2)
        url = f"http://127.0.0.1:{exporter.port}/"
        await asyncio.to_thread(screenshot, url, path, 1500, 1400)
    finally:
        await exporter.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", type=Path, nargs="?", default=Path("docs/images/status-page.png"))
    path = parser.parse_args().path
    path.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(photograph(path))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
