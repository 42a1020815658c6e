"""docs/simulator.md's fidelity table names every C function the simulator implements (the rest
answer NotSupported, each with its reason in data/nvml_not_supported.tsv)."""

from __future__ import annotations

import pathlib
import re

from gpu_exporter.simulator.library import IMPLEMENTED

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "simulator.md"


def fidelity_section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("\n## Fidelity\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_every_simulated_c_function_has_a_row_in_the_fidelity_table() -> None:
    rows = [line for line in fidelity_section().splitlines() if line.startswith("| `nvml")]
    named = {name for row in rows for name in re.findall(r"`(nvml\w+)`", row.split(" | ")[0])}
    missing = sorted(IMPLEMENTED - named)
    assert missing == [], f"add to docs/simulator.md's fidelity table: {missing}"
    unknown = sorted(named - IMPLEMENTED)
    assert unknown == [], f"the table names functions the simulator does not have: {unknown}"
