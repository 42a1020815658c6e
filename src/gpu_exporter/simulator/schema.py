"""Small validators that carry the key path, so errors can say exactly where a scenario is wrong."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gpu_exporter.safeyaml import quote
from gpu_exporter.simulator.errors import Invalid
from gpu_exporter.simulator.patterns import IDLE, Bursty, Pattern, Ramp, Steady
from gpu_exporter.simulator.units import parse_duration

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_KEY_QUOTED = 64  # characters of a key spelled out in an error's path


def key(path: str, name: str) -> str:
    """``path.name``; a name that would read ambiguously in a path (a dot, a bracket, spaces,
    anything unprintable or a lone surrogate) is quoted: ``path["a.b"]``."""
    if not _PLAIN_KEY.fullmatch(name):
        if len(name) > MAX_KEY_QUOTED:  # a hostile key must not make a megabyte error line
            return f"{path}[{json.dumps(name[:MAX_KEY_QUOTED])}...]"
        return f"{path}[{json.dumps(name)}]"  # ASCII-only: every character is spelled out
    return f"{path}.{name}" if path else name


def item(path: str, index: int) -> str:
    return f"{path}[{index}]"


def mapping(
    value: Any, path: str, allowed: Collection[str], required: Collection[str] = ()
) -> Mapping[str, Any]:
    """A mapping with only ``allowed`` string keys and all ``required`` ones."""
    if not isinstance(value, Mapping):
        raise Invalid(path, f"expected a mapping, got {type(value).__name__}")
    for name in value:
        if not isinstance(name, str):
            raise Invalid(path, f"keys must be strings, got {quote(name)}")
        if name not in allowed:
            raise Invalid(key(path, name), f"unknown key (allowed: {', '.join(sorted(allowed))})")
    for name in sorted(required):
        if name not in value:
            raise Invalid(key(path, name), "required key is missing")
    return value


def sequence(value: Any, path: str) -> Sequence[Any]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise Invalid(path, f"expected a list, got {type(value).__name__}")
    return value


def integer(value: Any, path: str, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(path, f"expected an integer, got {quote(value)}")
    if low is not None and value < low:
        raise Invalid(path, f"must be >= {low}, got {value}")
    if high is not None and value > high:
        raise Invalid(path, f"must be <= {high}, got {value}")
    return value


def text(value: Any, path: str, pattern: str | None = None) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise Invalid(path, f"expected a string, got {type(value).__name__}")
    result = str(value)
    if not result:
        raise Invalid(path, "must not be empty")
    try:
        result.encode("utf-8")
    except UnicodeEncodeError:
        # JSON can spell a lone UTF-16 surrogate ("\ud800"); no kernel or NVML text can hold one.
        raise Invalid(
            path, f"{quote(result)} is not valid Unicode text (a lone surrogate)"
        ) from None
    if pattern is not None and not re.fullmatch(pattern, result):
        raise Invalid(path, f"{quote(result)} does not match {pattern}")
    return result


MAX_CPU_ID = 8191  # Linux's NR_CPUS on distribution kernels


def cpu_ids(value: Any, path: str) -> tuple[int, ...]:
    """CPU ids: a list of integers, or a Linux cpulist string (``0-3,8``), sorted and unique."""
    if isinstance(value, str):
        ids: set[int] = set()
        for part in value.split(","):
            first, dash, last = part.strip().partition("-")
            if not first.isdigit() or (dash and not last.isdigit()):
                raise Invalid(path, f"{quote(value)} is not a cpulist such as 0-3,8")
            low, high = int(first), int(last) if dash else int(first)
            if high < low:
                raise Invalid(path, f"range {quote(part.strip())} runs backwards")
            if high > MAX_CPU_ID:
                raise Invalid(path, f"must be <= {MAX_CPU_ID}, got {high}")
            ids.update(range(low, high + 1))
        return tuple(sorted(ids))
    listed = sequence(value, path)
    return tuple(
        sorted({integer(cpu, item(path, i), 0, MAX_CPU_ID) for i, cpu in enumerate(listed)})
    )


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise Invalid(path, f"expected true or false, got {quote(value)}")
    return value


def choice(value: Any, path: str, choices: Collection[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise Invalid(path, f"expected one of {', '.join(sorted(choices))}; got {quote(value)}")
    return value


def ratio(value: Any, path: str) -> float:
    """A ratio 0..1, or a percentage string such as ``'85%'``."""
    if isinstance(value, str) and (match := _PERCENT.match(value)):
        result = float(match.group(1)) / 100
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
    else:
        raise Invalid(path, f"expected a ratio 0..1 or a percentage like '85%', got {quote(value)}")
    if not 0 <= result <= 1:
        raise Invalid(path, f"must be between 0 and 1 (or 0%..100%), got {quote(value)}")
    return result


_PATTERN_KEYS = {
    "steady": ({"pattern", "value"}, {"value"}),
    "idle": ({"pattern"}, set()),
    "bursty": ({"pattern", "value", "low", "period", "duty"}, {"value", "period", "duty"}),
    "ramp": ({"pattern", "from", "to", "period"}, {"from", "to", "period"}),
}


def pattern(value: Any, path: str) -> Pattern:
    """An activity: a ratio, ``idle``, or ``{pattern: steady|idle|bursty|ramp, ...}``."""
    if value == "idle":
        return IDLE
    if not isinstance(value, Mapping):
        return Steady(ratio(value, path))
    kind = choice(value.get("pattern"), key(path, "pattern"), _PATTERN_KEYS)
    allowed, required = _PATTERN_KEYS[kind]
    mapping(value, path, allowed, required)
    if kind == "idle":
        return IDLE
    if kind == "steady":
        return Steady(ratio(value["value"], key(path, "value")))
    period = parse_duration(value["period"], key(path, "period"))
    if period <= 0:
        raise Invalid(key(path, "period"), "must be greater than zero")
    if kind == "ramp":
        return Ramp(
            ratio(value["from"], key(path, "from")), ratio(value["to"], key(path, "to")), period
        )
    duty = ratio(value["duty"], key(path, "duty"))
    low = ratio(value.get("low", 0), key(path, "low"))
    return Bursty(ratio(value["value"], key(path, "value")), period, duty, low)
