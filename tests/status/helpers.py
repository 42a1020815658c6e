"""Reading the status page's JSON from a running exporter."""

from __future__ import annotations

from typing import Any

import aiohttp

from gpu_exporter.app import Exporter
from gpu_exporter.collectors import Cadence


async def status_json(session: aiohttp.ClientSession) -> dict[str, Any]:
    async with session.get("/status.json") as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        document: dict[str, Any] = await response.json()
    return document


def device(document: dict[str, Any], gpu: str, kind: str = "gpu") -> dict[str, Any]:
    found = [d for d in document["devices"] if d["gpu"] == gpu and d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} row for GPU {gpu}, found {len(found)}"
    return found[0]


async def notebook_seen_idle(exporter: Exporter, session: aiohttp.ClientSession) -> None:
    """Idle time accrues from the second GPM sample on: wait (rounds, not seconds) until the
    idle notebook has an idle streak, as a person opening the page a moment later would see."""
    for _ in range(20):
        if device(await status_json(session), "5")["idle_allocated"]:
            return
        await exporter.sampler.wait_for_rounds(Cadence.FAST, 1)
