"""A GPU on the PCI bus that NVML never lists (dead at boot) is visible: expected > visible."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from gpu_exporter.config import SimulatorConfig
from gpu_exporter.pci import count_pci_gpus
from tests.helpers import make_config, one, parse_exposition, running_exporter, select

SCENARIO = """
gpus: [{model: H100-SXM-80GB, count: 4}]
timeline:
  - {at: 0s, type: gpu_missing_at_boot, gpu: 2}
"""


async def test_a_gpu_missing_at_boot_is_expected_but_not_visible(tmp_path: Path) -> None:
    scenario = tmp_path / "node.yaml"
    scenario.write_text(SCENARIO)
    config = make_config(simulator=SimulatorConfig(scenario=scenario), allocation=False, kmsg=False)
    async with (
        running_exporter(config) as exporter,
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{exporter.port}/metrics") as response,
    ):
        series = parse_exposition(await response.text())
    assert one(series, "gpu_exporter_expected_gpus") == 4, "the bus still has the dead GPU"
    assert one(series, "gpu_exporter_visible_gpus") == 3
    assert len(select(series, "gpu_up")) == 3, "NVML renumbers the GPUs it lists: 0..2"


def test_only_nvidia_display_and_3d_controllers_count_as_gpus(tmp_path: Path) -> None:
    devices = tmp_path / "bus" / "pci" / "devices"
    for address, vendor, pci_class in (
        ("0000:18:00.0", "0x10de", "0x030200"),  # 3D controller
        ("0000:18:00.1", "0x10de", "0x040300"),  # its audio function
        ("0000:05:00.0", "0x10de", "0x068000"),  # an NVSwitch
        ("0000:03:00.0", "0x10de", "0x030000"),  # a VGA-class GPU
        ("0000:00:02.0", "0x8086", "0x030000"),  # someone else's VGA controller
    ):
        entry = devices / address
        entry.mkdir(parents=True)
        (entry / "vendor").write_text(vendor + "\n")
        (entry / "class").write_text(pci_class + "\n")
    (devices / "0000:99:00.0").mkdir()  # a function whose files cannot be read
    assert count_pci_gpus(tmp_path) == 2
    assert count_pci_gpus(tmp_path / "absent") is None, "an unreadable bus is unknown, not 0"
