"""The DCGM binding, its service and the simulator's fake host engine are loaded only by an
exporter that uses DCGM (``--dcgm.address``/``--dcgm.embedded``): the others do not pay for them
(docs/performance.md, Peak RSS). Each case builds the exporter in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BUILD = """
import json, sys
from gpu_exporter.app import build_exporter
from gpu_exporter.cli import host_for, parse_config
config = parse_config(sys.argv[1:], {})
build_exporter(config, host_for(config))
print(json.dumps(  # the last line: unconfigured logging also prints
    sorted(m for m in sys.modules if "dcgm" in m)))
"""
BINDING = {
    "gpu_exporter.dcgm.library",
    "gpu_exporter.dcgm.structs",
    "gpu_exporter.dcgm.session",
    "gpu_exporter.dcgm.service",
    "gpu_exporter.simulator.dcgm_engine",
    "gpu_exporter.simulator.dcgm_library",
}


def dcgm_modules_after_building(tmp_path: Path, *flags: str) -> set[str]:
    argv = ["--simulate", f"--kmsg-path={tmp_path / 'kmsg'}", f"--state-dir={tmp_path / 'state'}"]
    result = subprocess.run(
        [sys.executable, "-c", BUILD, *argv, *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_without_dcgm_flags_neither_the_binding_nor_the_fake_engine_is_imported(
    tmp_path: Path,
) -> None:
    loaded = dcgm_modules_after_building(tmp_path)
    assert not loaded & BINDING, f"loaded without --dcgm.*: {sorted(loaded & BINDING)}"


def test_with_dcgm_the_binding_and_the_fake_engine_are_built(tmp_path: Path) -> None:
    loaded = dcgm_modules_after_building(tmp_path, "--dcgm.embedded")
    assert loaded >= BINDING, f"--dcgm.embedded did not load {sorted(BINDING - loaded)}"
