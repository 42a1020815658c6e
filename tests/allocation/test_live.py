"""The subsystem wired to a running Sampler on the built-in simulated node, in real time."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from gpu_exporter.allocation.subsystem import AllocationSubsystem
from gpu_exporter.collectors import Cadence, collector_names
from gpu_exporter.config import Config
from gpu_exporter.nvml import WorkerPool
from gpu_exporter.sampler import Sampler
from gpu_exporter.simulator import SimulatedNode, install, load_scenario, uninstall
from gpu_exporter.simulator.kubelet import SimulatedKubelet

from .helpers import named, series

FAST = 0.2


@pytest.fixture
async def live() -> AsyncIterator[tuple[Sampler, AllocationSubsystem]]:
    node = SimulatedNode(load_scenario(None))
    install(node)
    pool = WorkerPool(size=4, name="test-live")
    config = Config(fast_interval=FAST, slow_interval=30.0, collectors=frozenset(collector_names()))
    sampler = Sampler(config, pool)
    kubelet = SimulatedKubelet(node)  # its own temporary directory, as under --simulate
    subsystem = AllocationSubsystem(
        socket_path=kubelet.socket_path,
        devices=sampler.devices,
        ledger=sampler.ledger,
        executor=pool,
        poll_interval=FAST,
        update_interval=FAST / 2,
        process_interval=FAST,
        proc_path=kubelet.proc_path,
        pod_logs_path=kubelet.pod_logs_path,
    )
    sampler.add_source(subsystem)
    await kubelet.start()
    await sampler.start()
    await subsystem.start()
    try:
        yield sampler, subsystem
    finally:
        await subsystem.stop()
        await sampler.stop()
        await kubelet.close()
        pool.shutdown()
        uninstall()
        node.close()


def notebook(values: dict[str, float], name: str) -> float:
    return next(v for k, v in named(values, name).items() if 'pod="jupyter-alice"' in k)


async def test_idle_notebook_accrues_a_second_per_second(
    live: tuple[Sampler, AllocationSubsystem],
) -> None:
    sampler, subsystem = live
    while not subsystem.up:
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
