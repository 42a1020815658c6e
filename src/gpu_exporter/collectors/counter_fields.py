"""Which NVML field holds each clock-event reason's time counter, for the running driver.

The table is ``data/clock_event_fields.tsv`` (its sources are cited there): the counters moved
from 251-253 (drivers 575 to 580.65) to 269-271 (580.82 and later), and on the builds where
they are not counters those ids hold power-smoothing settings, so the choice is by version.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType

_VERSION = re.compile(r"\d+(\.\d+)*")
TABLE = "data/clock_event_fields.tsv"


class CounterTableError(ValueError):
    """The bundled table is malformed (a packaging defect): names the line."""


@dataclass(frozen=True)
class CounterRow:
    from_driver: tuple[int, ...]
    fields: Mapping[str, int]  # reason name -> field id, only reasons that have a counter


def driver_key(version: str) -> tuple[int, ...] | None:
    """``"580.95.05"`` -> (580, 95, 5); None when the text is not a dotted version."""
    match = _VERSION.match(version.strip())
    if match is None:
        return None
    return tuple(int(part) for part in match.group(0).split("."))


def parse_table(text: str, source: str = TABLE) -> tuple[CounterRow, ...]:
    rows: list[CounterRow] = []
    header: list[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if header is None:
            header = cells
            continue
        version = driver_key(cells[0])
        if len(cells) != len(header) or version is None:
            raise CounterTableError(f"{source}:{number}: malformed row {line[:60]!r}")
        try:
            pairs = zip(header[1:], cells[1:], strict=True)
            fields = {name: int(cell) for name, cell in pairs if cell != "-"}
        except ValueError:
            raise CounterTableError(f"{source}:{number}: field ids are numbers or -") from None
        if rows and version <= rows[-1].from_driver:
            raise CounterTableError(f"{source}:{number}: rows must ascend by driver version")
        rows.append(CounterRow(version, MappingProxyType(fields)))
    if not rows:
        raise CounterTableError(f"{source}: no rows")
    return tuple(rows)


def bundled_table() -> tuple[CounterRow, ...]:
    text = resources.files("gpu_exporter").joinpath(TABLE).read_text("utf-8")
    return parse_table(text)


def counter_fields(driver_version: str) -> Mapping[str, int]:
    """Reason name -> counter field id on this driver (the oldest row when unparsable)."""
    table = bundled_table()
    key = driver_key(driver_version)
    if key is None:
        return table[0].fields
    chosen = table[0]
    for row in table:
        if key >= row.from_driver:
            chosen = row
    return chosen.fields
