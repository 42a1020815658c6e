"""Shared GPUs on the built-in node, in real time: per-container activity, per-pod idle, modes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from gpu_exporter.allocation.subsystem import AllocationSubsystem
from gpu_exporter.collectors import Cadence
from gpu_exporter.sampler import Sampler

from .helpers import named, series
from .live import live_builtin_node

FAST = 0.25


@pytest.fixture
async def live() -> AsyncIterator[tuple[Sampler, AllocationSubsystem]]:
    async with live_builtin_node(FAST, "test-shared") as running:
        yield running


def of_pod(values: dict[str, float], name: str, pod: str) -> float:
    found = [v for k, v in named(values, name).items() if f'pod="{pod}"' in k and 'gpu="4"' in k]
    assert len(found) == 1, f"one {name} series for {pod} on GPU 4, got {found}"
    return found[0]


async def test_the_time_sliced_gpu_tells_its_busy_pod_from_its_idle_one(
    live: tuple[Sampler, AllocationSubsystem],
) -> None:
    sampler, subsystem = live
    while not subsystem.published.up:
        await subsystem.wait_for_poll()
    # Per-process samples come once a second; the first read is a baseline.
    await sampler.wait_for_rounds(Cadence.FAST, int(2.5 / FAST))
    first, started = series(subsystem.samples()), time.monotonic()
    await sampler.wait_for_rounds(Cadence.FAST, int(4 / FAST))
    last, elapsed = series(subsystem.samples()), time.monotonic() - started

    def gained(name: str, pod: str) -> float:
        return of_pod(last, name, pod) - of_pod(first, name, pod)

    active = "gpu_container_sm_active_seconds_total"
    # Within one sample (1 s) at either end of the window, however loaded the machine is.
    assert gained(active, "llm-serve-a") == pytest.approx(elapsed, abs=1.6), "busy: 1 s/s"
    assert gained(active, "llm-serve-b") == 0, "idle pod: flat"
    idle = "gpu_allocated_idle_seconds_total"
    assert gained(idle, "llm-serve-b") == pytest.approx(elapsed, abs=1.6), "idle pod ~1 s/s"
    assert gained(idle, "llm-serve-a") <= 0.5, "the busy pod accrues ~0"
    assert of_pod(last, "gpu_container_sm_active_ratio", "llm-serve-a") == pytest.approx(1.0)
    assert of_pod(last, "gpu_container_sm_active_ratio", "llm-serve-b") == 0


async def test_sharing_modes_of_the_built_in_node(
    live: tuple[Sampler, AllocationSubsystem],
) -> None:
    _, subsystem = live
    while not subsystem.published.up:
        await subsystem.wait_for_poll()
    modes = {
        key.split('gpu="')[1].split('"')[0]: key.split('mode="')[1].split('"')[0]
        for key in named(series(subsystem.samples()), "gpu_sharing_info")
    }
    assert modes == {
        **{gpu: "exclusive" for gpu in "0123"},
        "4": "time_slicing",
        "5": "exclusive",
        "6": "mig",
        "7": "unallocated",
    }
