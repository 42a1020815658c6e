"""What starting leaves behind for the garbage collector: nothing pending when serving begins."""

from __future__ import annotations

import gc
from pathlib import Path

from gpu_exporter.config import SimulatorConfig
from tests.helpers import make_config, simulated_exporter


async def test_the_startups_garbage_is_collected_before_the_server_listens(
    tmp_path: Path,
) -> None:
    """Starting promotes tens of thousands of objects (imports, discovery, the scenario); the
    full collection they make due runs before the first request, not in the middle of a scrape
    minutes later. Each full collection is recorded with whether the server listened yet."""
    exporter, _ = simulated_exporter(
        make_config(
            simulator=SimulatorConfig(),
            kmsg_path=tmp_path / "kmsg",
            state_dir=tmp_path / "state",
        )
    )
    full_collections: list[bool] = []

    def on_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full_collections.append(exporter.web_server is not None)

    gc.callbacks.append(on_collection)
    try:
        await exporter.start()
        young_collections_since_full = gc.get_count()[2]
    finally:
        gc.callbacks.remove(on_collection)
        await exporter.stop()
    assert full_collections, "no full collection ran while starting"
    assert not full_collections[-1], (
        "no full collection ran after the parts started and before the server listened"
        f" (each full collection, with whether the server listened: {full_collections})"
    )
    assert young_collections_since_full == 0, (
        "generation-1 collections ran after the startup's full collection: what starting"
        " promoted was not all collected before serving"
    )
