"""The golden exposition: everything the exporter serves for tests/golden/scenario.yaml after a
fixed run on a manual clock (node_exporter's e2e-output.txt idea). ``make golden`` rewrites
``exposition.txt``; ``test_golden.py`` fails with the diff when the series change.

Every part that adds series is here, driven round by round (no background loops, no wall clock):
the sampler and its collectors, allocation (through the simulated kubelet and host /proc), the
Xid subsystem (two Xids handed in as the NVML event thread would) and the HTTP guard. Values that
measure this machine (how long a collector ran) are written as ``<timing>``.
"""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
from pathlib import Path

from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.collectors import ALL_COLLECTORS, Cadence
from gpu_exporter.http.webguard import RequestGuard
from gpu_exporter.nvml import WorkerPool
from gpu_exporter.sampler import Sampler
from gpu_exporter.simulator import SimulatedNode, install, load_scenario, uninstall
from gpu_exporter.simulator.kubelet import SimulatedKubelet
from gpu_exporter.xid import XidSettings, XidSubsystem
from tests.helpers import ManualClock, SharedState, make_config

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "scenario.yaml"
GOLDEN = HERE / "exposition.txt"
ROUNDS = 10  # fast rounds, one simulated second apart, after one slow round
WALL_EPOCH = 1_800_000_000.0  # wall time = this + the manual clock
# Families whose values measure the machine running the test, not the exporter's logic.
TIMING_FAMILIES = ("gpu_exporter_collector_duration_seconds",)
_TIMING = re.compile(r"^((?:" + "|".join(TIMING_FAMILIES) + r")(?:\{[^}]*\})?) \S+$", re.M)


async def golden_exposition() -> str:
    clock = ManualClock()
    node = SimulatedNode(load_scenario(SCENARIO), clock=clock)
    install(node)
    pool = WorkerPool(size=4)
    scratch = Path(tempfile.mkdtemp(prefix="gpu-golden-", dir="/tmp"))
    kubelet = SimulatedKubelet(node, scratch / "kubelet.sock", files_root=scratch / "host")
    # Rounds wait for their jobs up to min(nvml timeout, interval) of real time: long enough here
    # that a loaded machine never turns a slow job into a "hung" one and changes the file.
    # The collectors a node runs at defaults: what the file shows is what a default node serves.
    defaults = frozenset(c.name for c in ALL_COLLECTORS if c.enabled_by_default)
    config = make_config(
        fast_interval=60.0, slow_interval=60.0, nvml_timeout=60.0, collectors=defaults
    )
    shared = SharedState()
    sampler = shared.sampler(config, pool, clock=clock)
    try:
        await kubelet.start()
        await sampler.start(background=False)
        allocation = AllocationSubsystem(
            AllocationSettings(
                socket_path=kubelet.socket_path,
                proc_path=kubelet.proc_path,
                pod_logs_path=kubelet.pod_logs_path,
            ),
            devices=sampler.devices,
            ledger=shared.ledger,
            mig_profiles=shared.mig_profiles,
            executor=pool,
            errors=shared.errors,
            clock=clock,
            wall_clock=lambda: WALL_EPOCH + clock(),
        )
        xid = XidSubsystem(
            XidSettings(kmsg_path=None, state_dir=None, nvml_events=False, boot_id="golden-boot"),
            devices=sampler.devices,
            unidentified_lost=sampler.unidentified_lost,
            holders=allocation.holders,
            clock=lambda: WALL_EPOCH + clock(),
            uptime=clock,
        )
        for source in (allocation, xid, RequestGuard(None, max_requests=40, clock=clock)):
            sampler.add_source(source)
        await xid.start()
        try:
            return await _run(sampler, allocation, xid, kubelet, clock)
        finally:
            await xid.stop()
            await allocation.stop()
    finally:
        await sampler.stop()
        await kubelet.stop()
        pool.shutdown()
        node.close()
        uninstall()


async def _run(
    sampler: Sampler,
    allocation: AllocationSubsystem,
    xid: XidSubsystem,
    kubelet: SimulatedKubelet,
    clock: ManualClock,
) -> str:
    await kubelet.refresh()
    await sampler.sample_round(Cadence.SLOW)
    for second in range(ROUNDS):
        clock.advance(0.5)
        allocation.round_done()
        clock.advance(0.5)
        await sampler.sample_round(Cadence.FAST)
        await allocation.poll()
        allocation.round_done()
        if second == 4:
            devices = {d.id.index: d.id for d in sampler.devices() if not d.id.is_mig}
            xid._on_nvml_xid(13, devices[0], None, WALL_EPOCH + clock())  # application
            xid._on_nvml_xid(48, devices[1], None, WALL_EPOCH + clock())  # hardware: drain
    await allocation.scan_processes()
    sampler.note_news()
    return _TIMING.sub(r"\1 <timing>", sampler.exposition.text.decode())


def main() -> int:
    GOLDEN.write_text(asyncio.run(golden_exposition()))
    print(
        f"wrote {GOLDEN.relative_to(Path.cwd()) if GOLDEN.is_relative_to(Path.cwd()) else GOLDEN}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
