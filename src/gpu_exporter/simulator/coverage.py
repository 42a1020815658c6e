"""NVML functions answered from data tables: NotSupported (and why), and constants.

``data/nvml_not_supported.tsv`` lists every C function pynvml wraps that the simulator does not
implement, with a category and the reason (its header explains the categories). Together with the
implemented functions it covers everything pynvml looks up, so a pynvml program run on the
simulator gets a value or NotSupported, never FunctionNotFound, as on a real Hopper-era driver.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

# nvmlReturn_t values (as in nvml_base, which this data module does not import: it stays a leaf).
SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED, GPU_IS_LOST = 0, 2, 3, 15
DeviceOf = Callable[[Any], Any]  # SimulatedNode.device_of: handle -> device (with .gpu) or None

CATEGORIES = frozenset({"not_supported", "setter", "not_modelled"})


@dataclass(frozen=True)
class Unsupported:
    function: str
    category: str
    reason: str


@cache
def not_supported_table() -> Mapping[str, Unsupported]:
    """The table, by C function name; ValueError naming the line for a malformed row."""
    rows: dict[str, Unsupported] = {}
    for n, row in _rows("nvml_not_supported.tsv", 3):
        if row[1] not in CATEGORIES:
            raise ValueError(f"nvml_not_supported.tsv:{n}: unknown category {row[1]!r}")
        rows[row[0]] = Unsupported(*row)
    return rows


def _rows(name: str, columns: int) -> list[tuple[int, list[str]]]:
    """(line number, cells) of a data table: ``#`` comments, a header line, then rows."""
    text = resources.files("gpu_exporter.simulator").joinpath(f"data/{name}").read_text()
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line[:1] not in "#"]
    rows: list[tuple[int, list[str]]] = []
    seen: set[str] = set()
    for n, line in lines[1:]:  # the first is the column header
        row = line.split("\t")
        if len(row) != columns or not row[0].startswith("nvml"):
            raise ValueError(f"{name}:{n}: want {columns} tab-separated cells: {row}")
        if row[0] in seen:
            raise ValueError(f"{name}:{n}: {row[0]} listed twice")
        seen.add(row[0])
        rows.append((n, row))
    return rows


def not_supported_function(device_of: DeviceOf) -> Callable[..., int]:
    """What an unimplemented function does: GpuIsLost for a lost GPU's handle, else NotSupported."""

    def unsupported(*args: Any) -> int:
        device = device_of(args[0]) if args else None
        if device is not None and device.gpu.lost:
            return GPU_IS_LOST
        return NOT_SUPPORTED

    return unsupported


@dataclass(frozen=True)
class Constant:
    function: str
    scope: str  # "device": f(handle, &value); "system": f(&value)
    value: int
    meaning: str


@cache
def constants_table() -> Mapping[str, Constant]:
    """``data/nvml_constants.tsv``: functions that answer one constant, by C name."""
    rows: dict[str, Constant] = {}
    for n, row in _rows("nvml_constants.tsv", 4):
        if row[1] not in ("device", "system") or not row[2].isdigit():
            raise ValueError(f"nvml_constants.tsv:{n}: want function, device|system, int: {row}")
        rows[row[0]] = Constant(row[0], row[1], int(row[2]), row[3])
    return rows


def constant_function(device_of: DeviceOf, constant: Constant) -> Callable[..., int]:
    """The fake C function answering ``constant`` (device calls check the handle first)."""

    def answer(*args: Any) -> int:
        if constant.scope == "device":
            device = device_of(args[0])
            if device is None:
                return INVALID_ARGUMENT
            if device.gpu.lost:
                return GPU_IS_LOST
        target = args[-1]
        if target is None:
            return INVALID_ARGUMENT
        getattr(target, "_obj", target).value = constant.value
        return SUCCESS

    return answer
