"""The subsystem wired to a running Sampler on the built-in simulated node, in real time."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from gpu_exporter.allocation.subsystem import AllocationSubsystem
from gpu_exporter.collectors import Cadence
from gpu_exporter.sampler import Sampler

from .helpers import named, series
from .live import live_builtin_node

FAST = 0.2


@pytest.fixture
async def live() -> AsyncIterator[tuple[Sampler, AllocationSubsystem]]:
    async with live_builtin_node(FAST, "test-live") as running:
        yield running


def notebook(values: dict[str, float], name: str) -> float:
    return next(v for k, v in named(values, name).items() if 'pod="jupyter-alice"' in k)


async def test_idle_notebook_accrues_a_second_per_second(
    live: tuple[Sampler, AllocationSubsystem],
) -> None:
    sampler, subsystem = live
    while not subsystem.published.up:
        await subsystem.wait_for_poll()
    await sampler.wait_for_rounds(Cadence.FAST, 3)  # GPM has a reading; accounting has started
    started = time.monotonic()
    first = series(subsystem.samples())
    await sampler.wait_for_rounds(Cadence.FAST, 10)
    elapsed = time.monotonic() - started
    text = sampler.exposition.text.decode()
    last = series(subsystem.samples())
    gained_idle = notebook(last, "gpu_allocated_idle_seconds_total") - notebook(
        first, "gpu_allocated_idle_seconds_total"
    )
    gained = notebook(last, "gpu_allocated_seconds_total") - notebook(
        first, "gpu_allocated_seconds_total"
    )
    # Within one accounting update at either end of the window, however loaded the machine is.
    assert gained == pytest.approx(elapsed, abs=2 * FAST)
    assert gained_idle == pytest.approx(gained, abs=2 * FAST)
    assert 'gpu_exporter_source_up{source="pod_resources"} 1' in text
    assert "gpu_allocation_info{" in text
    assert 'gpu_container_memory_used_bytes{gpu="5"' in text
    assert text.count("# TYPE gpu_exporter_source_up gauge") == 1
