"""Driver branches: how the simulated driver numbers NVML field ids (``data/drivers.yaml``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml


@dataclass(frozen=True)
class FieldLayout:
    """One driver branch's field ids: which it knows, and which moved against the newest header."""

    fi_max: int
    renumber: Mapping[int, int]
    source: str

    def canonical(self, field_id: int) -> int | None:
        """The newest header's id for ``field_id`` on this driver; None if it does not know it."""
        if not 0 < field_id < self.fi_max:
            return None
        return self.renumber.get(field_id, field_id)


def version_key(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(p) for p in match.group(0).split(".")) if match else (0,)


def field_layout(driver_version: str) -> FieldLayout:
    """The layout of the newest row whose ``from`` is at or below ``driver_version``."""
    text = resources.files("gpu_exporter.simulator").joinpath("data/drivers.yaml").read_text()
    rows: list[dict[str, Any]] = yaml.safe_load(text)
    key = version_key(driver_version)
    chosen = max(
        (row for row in rows if version_key(str(row["from"])) <= key),
        key=lambda row: version_key(str(row["from"])),
    )
    renumber = {int(k): int(v) for k, v in (chosen.get("renumber") or {}).items()}
    return FieldLayout(int(chosen["fi_max"]), renumber, str(chosen["source"]))
