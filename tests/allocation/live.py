"""The allocation subsystem wired to a running Sampler on the built-in simulated node, with the
simulated kubelet in its own temporary directory (as under --simulate), in real time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.collectors import collector_names
from gpu_exporter.config import Config
from gpu_exporter.nvml import WorkerPool
from gpu_exporter.sampler import Sampler
from gpu_exporter.simulator import SimulatedNode, install, load_scenario, uninstall
from gpu_exporter.simulator.kubelet import SimulatedKubelet
from gpu_exporter.simulator.scenario import Scenario
from tests.helpers import SharedState


@asynccontextmanager
async def live_builtin_node(
    fast: float,
    pool_name: str,
    scenario: Scenario | None = None,
    *,
    node: SimulatedNode | None = None,
) -> AsyncIterator[tuple[Sampler, AllocationSubsystem]]:
    """Started sampler and subsystem polling every ``fast`` seconds and accounting after each
    fast round (on ``node``, a test's to inject events into, else on ``scenario``, else the
    built-in node); everything stopped after."""
    node = node or SimulatedNode(scenario or load_scenario(None))
    install(node)
    pool = WorkerPool(size=4, name=pool_name)
    config = Config(fast_interval=fast, slow_interval=30.0, collectors=frozenset(collector_names()))
    shared = SharedState()
    sampler = shared.sampler(config, pool)
    kubelet = SimulatedKubelet(node)
    subsystem = AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket_path,
            poll_interval=fast,
            process_interval=fast,
            proc_path=kubelet.proc_path,
            pod_logs_path=kubelet.pod_logs_path,
        ),
        devices=sampler.devices,
        ledger=shared.ledger,
        executor=pool,
    )
    sampler.add_source(subsystem)
    sampler.add_round_listener(subsystem)  # accounting after each fast round, as the app wires it
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
