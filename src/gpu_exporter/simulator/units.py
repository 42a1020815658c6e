"""Parsing of the scenario's durations (``90s``, ``2m``) and sizes (``60GiB``)."""

from __future__ import annotations

import re
from typing import Any

from gpu_exporter.safeyaml import quote
from gpu_exporter.simulator.errors import Invalid

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$")
_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}


MAX_DURATION_S = 100 * 365 * 86_400.0


def parse_duration(value: Any, path: str) -> float:
    """Seconds from a number of seconds or a Go-style string such as ``1m30s`` or ``500ms``."""
    if isinstance(value, bool):
        raise Invalid(path, f"expected a duration such as '90s', got {quote(value)}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        seconds = _parse_duration_text(value.strip(), path)
    else:
        raise Invalid(path, f"expected a duration such as '90s', got {quote(value)}")
    if seconds < 0:
        raise Invalid(path, f"duration must not be negative, got {quote(value)}")
    if not seconds <= MAX_DURATION_S:  # also NaN; .inf was accepted and then threw
        raise Invalid(path, f"duration must be at most 100 years, got {quote(value)}")
    return seconds


def _parse_duration_text(text: str, path: str) -> float:
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or pos == 0:
        raise Invalid(path, f"bad duration {quote(text)} (use e.g. '90s', '2m', '1h30m', '500ms')")
    return total


def parse_bytes(value: Any, path: str) -> int:
    """Bytes from an integer or a string such as ``60GiB`` or ``512MiB``."""
    if isinstance(value, bool):
        raise Invalid(path, f"expected a size such as '60GiB', got {quote(value)}")
    if isinstance(value, int):
        if value < 0:
            raise Invalid(path, f"size must not be negative, got {quote(value)}")
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None:
        raise Invalid(path, f"bad size {quote(value)} (use e.g. '60GiB', '512MiB' or bytes)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])
