"""The hardware check script itself works (dry run on the simulator), so a session lent a GPU
does not spend its few device minutes on a broken script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_hardware_check_reports_every_family_in_a_dry_run(tmp_path: Path) -> None:
    report = tmp_path / "hardware-check.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "hardware" / "check.py"),
            "--simulate",
            "--settle-seconds=1",
            f"--json={report}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    results = json.loads(report.read_text())
    idle = results["idle"]
    assert results["exit_status"] == 0
    served = ("gpu_info", "gpu_sm_active_seconds_total", "gpu_energy_joules_total", "gpu_allocated")
    for family in served:
        assert not idle[family].startswith("absent"), f"{family}: {idle[family]}"
    assert idle["gpu_retired_pages_total"].startswith("absent"), "H100s have no retired pages"
    facts = results["nvml"]["gpus"]["0"]
    assert set(facts["fields"]) == {"74", "76", "230", "251", "252", "253", "269", "270", "271"}
    assert facts["fields"]["270"].startswith("valueType 3"), "the dry run's driver: 269-271"
    assert facts["fields"]["251"].startswith("return 3"), "power smoothing: not on an H100"
    assert set(facts["gpm"]) == {"one sample", "50 ms apart", "250 ms apart", "reversed"}
    assert "holds" in facts["memory"]
    thermal = results["reasons_idle"]["0"]  # the dry run starts a thermal slowdown on GPU 0
    assert "hw_slowdown" in thermal, thermal
    assert "hw_thermal_slowdown" in thermal, thermal

    dra = results["dra"]  # what DRA attribution needs: device minors, mig-minors
    assert dra["gpus"]["0"]["minor"] == 0, "the built-in node's minors are its indexes"
    assert "mig_minors" in dra
    assert "DRA: device minors and mig-minors" in result.stdout

    topology = results["topology"]  # what the placement signals need (issue 36)
    gpu0 = topology["gpus"]["0"]
    assert gpu0["numa_node_id"].startswith("error: Not Supported"), "x86 HGX: no GPU NUMA node"
    assert gpu0["cpu_affinity_node"]["count"] == 112, "the HGX layout's socket 0"
    assert gpu0["with_itself"]["common_ancestor"] == 0, "INTERNAL, as the simulator assumes"
    assert topology["read_topology"]["paths"]["0-1"] == "nvlink"
    assert topology["mig"]["6"]["cpu_affinity"].startswith("error: Not Supported")


def test_the_hardware_check_learns_a_dcgm_address(tmp_path: Path) -> None:
    report = tmp_path / "hardware-check.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "hardware" / "check.py"),
            f"--simulate={ROOT / 'demo' / 'scenarios' / 'dcgm-a100-l40s.yaml'}",
            "--dcgm.address=127.0.0.1:5555",
            "--settle-seconds=5",
            f"--json={report}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    results = json.loads(report.read_text())
    dcgm = results["dcgm_idle"]
    assert dcgm["source_up"] == [1.0]
    assert set(dcgm["activity_source"].values()) == {"dcgm"}, dcgm
    assert not results["idle"]["gpu_sm_active_seconds_total"].startswith("absent")
