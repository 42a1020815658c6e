"""AllocationSettings' defaults are a default node's: a subsystem a test builds from them is
configured as a node run with no flags is (``app.build_exporter`` builds the settings from
``Config``), so the allocation package needs nothing from ``config``."""

from __future__ import annotations

from pathlib import Path

from gpu_exporter.allocation.subsystem import AllocationSettings
from gpu_exporter.app import build_exporter
from gpu_exporter.config import DEFAULT_POD_RESOURCES_SOCKET
from gpu_exporter.host import real_host
from tests.helpers import make_config


async def test_a_node_without_flags_gets_the_settings_defaults() -> None:
    config = make_config()
    exporter = build_exporter(config, real_host(config))
    try:
        assert exporter.allocation is not None
        built = exporter.allocation.settings
    finally:
        await exporter.stop()
    # Only the socket has no default, and a node reads the host's sysfs where tests read none.
    expected = AllocationSettings(socket_path=DEFAULT_POD_RESOURCES_SOCKET, sysfs_path=Path("/sys"))
    assert built == expected, "AllocationSettings' defaults drifted from Config's"


async def test_a_slurm_source_polls_at_its_own_interval_within_its_own_timeout() -> None:
    config = make_config(allocation_source="slurm-job-map", slurm_interval=7.0, slurm_timeout=3.0)
    exporter = build_exporter(config, real_host(config))
    try:
        assert exporter.allocation is not None
        settings = exporter.allocation.settings
    finally:
        await exporter.stop()
    assert settings.poll_interval == 7.0
    assert settings.call_timeout == 4.0, "the pool's wait should outlast scontrol's own timeout"
