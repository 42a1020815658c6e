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
    for family in ("gpu_info", "gpu_sm_active_ratio", "gpu_power_watts", "gpu_allocated"):
        assert not idle[family].startswith("absent"), f"{family}: {idle[family]}"
    assert idle["gpu_retired_pages_total"].startswith("absent"), "H100s have no retired pages"
