"""The interconnect counter table (``data/interconnect_fields.tsv``): which field ids feed which
``type`` label of the NVLink and PCIe counter families."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class CounterField:
    family: str  # nvlink_errors | pcie_errors | pcie_replays
    type: str
    field_id: int
    per_link: bool  # the link is the scope id
    name: str


@cache
def counter_fields() -> tuple[CounterField, ...]:
    text = resources.files("gpu_exporter").joinpath("data/interconnect_fields.tsv").read_text()
    rows: list[CounterField] = []
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    for number, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        if len(cells) != 5 or cells[3] not in ("total", "link"):
            raise ValueError(f"interconnect_fields.tsv: row {number}: malformed {line[:60]!r}")
        family, kind, field_id, scope, name = cells
        rows.append(CounterField(family, kind, int(field_id), scope == "link", name))
    return tuple(rows)


def fields_of(family: str) -> tuple[CounterField, ...]:
    return tuple(f for f in counter_fields() if f.family == family)
