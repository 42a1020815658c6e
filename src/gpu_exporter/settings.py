"""How a setting is declared: once, as a field of :class:`~gpu_exporter.config.Config`, or of a
collector's options class beside the collector (``collectors/base.option``).

A field made with :func:`setting` carries its flag (spelling, value type, help, group); its
default is the field's default. Everything else derives from that one declaration: the argparse
parser and the ``GPU_EXPORTER_*`` lookup (``cli.py``), the help text's "(default ...)", and the
README flags-table check (``tests/core/test_settings.py``). Adding a flag is adding a field::

    my_timeout: float = setting("--my-timeout", 5.0, DURATION, group="sampling", help="...")

This module is a leaf: it imports nothing of ours.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ENV_PREFIX = "GPU_EXPORTER_"
_METADATA_KEY = "gpu_exporter.flag"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_Options = TypeVar("_Options")

# argparse groups, in --help order: title for each ``group=`` a setting may name.
GROUPS = {
    "serving": "serving",
    "sampling": "sampling",
    "xid": "Xid errors",
    "allocation": "attribution to pods",
    "web": "web (TLS, auth, limits)",
    "dcgm": "DCGM host engine (SM activity without GPM)",
    "logging": "logging",
    "collectors": "collectors",
}


def parse_duration(text: str) -> float:
    """``1s``, ``500ms``, ``2m``, ``7d``, ``1.5`` (seconds) -> seconds; must be positive."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"invalid duration {text!r} (use e.g. 500ms, 1s, 2m)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def format_duration(seconds: float) -> str:
    """The shortest spelling :func:`parse_duration` reads: 604800 -> ``7d``, 0.5 -> ``500ms``."""
    for unit in ("d", "h", "m", "s"):
        count = seconds / _UNITS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds * 1000:g}ms"


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid listen address {text!r} (use HOST:PORT, e.g. 0.0.0.0:9445)")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_count(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"invalid count {text!r} (must be a whole number of at least 1)")
    return int(text)


def parse_path(text: str) -> Path:
    """A path; an empty one (``GPU_EXPORTER_STATE_DIR=``) is refused rather than read as the
    working directory: unset the variable for the default."""
    if not text.strip():
        raise ValueError("empty path (unset it for the default)")
    return Path(text)


def parse_ratio(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"invalid ratio {text!r} (must be between 0 and 1)")
    return value


@dataclass(frozen=True)
class ValueType:
    """How a flag's text becomes a value (``parse``, raising ValueError) and a value text."""

    parse: Callable[[str], Any]
    show: Callable[[Any], str] = str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None


DURATION = ValueType(parse_duration, format_duration, "DURATION")
PATH = ValueType(parse_path, str, "PATH")
COUNT = ValueType(parse_count, str, "N")
RATIO = ValueType(parse_ratio, str, "RATIO")
LISTEN = ValueType(parse_listen, lambda hp: f"{hp[0]}:{hp[1]}", "HOST:PORT")


def choice(*names: str) -> ValueType:
    return ValueType(str, str, None, names)


@dataclass(frozen=True)
class Flag:
    """One flag as declared; ``name`` and ``default`` are filled from its Config field.

    ``type`` None is an on/off switch (``--x`` / ``--no-x``). ``const`` makes the value
    optional: the flag alone means ``const``. ``also`` names further Config fields the parsed
    value (a tuple) sets, in order (``--listen`` sets host and port). ``none`` is how a None
    default reads in help and README. ``repeat``: the flag may be given several times; the value
    is a tuple of them (the default tuple when none is given; its environment variable is a
    comma-separated list).
    """

    option: str
    help: str
    group: str
    type: ValueType | None = None
    metavar: str | None = None
    const: str | None = None
    also: tuple[str, ...] = ()
    none: str = "none"
    repeat: bool = False
    name: str = ""
    default: Any = None

    @property
    def env(self) -> str:
        return env_name(self.option)

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.name, *self.also)

    @property
    def switch(self) -> bool:
        return self.type is None

    @property
    def shown_metavar(self) -> str | None:
        if self.type is None:
            return None
        if self.type.choices:
            return self.metavar or "|".join(self.type.choices)
        return self.metavar or self.type.metavar

    def shown_default(self) -> str:
        """The default as help text and the README's default column write it."""
        if self.default is None:
            return self.none
        if self.switch:
            return "on" if self.default else "off"
        assert self.type is not None
        if self.repeat:
            return ", ".join(self.type.show(v) for v in self.default) or self.none
        return self.type.show(self.default)

    def to_config(self, value: Any) -> dict[str, Any]:
        """Config fields from the parsed value."""
        if self.also:
            return dict(zip(self.fields, value, strict=True))
        return {self.name: value}


def env_name(option: str) -> str:
    return ENV_PREFIX + option.lstrip("-").replace("-", "_").replace(".", "_").upper()


def setting(
    option: str,
    default: Any,
    type: ValueType | None = None,
    *,
    help: str,
    group: str,
    metavar: str | None = None,
    const: str | None = None,
    also: tuple[str, ...] = (),
    none: str = "none",
    repeat: bool = False,
) -> Any:
    """A Config field that is also a flag (see the module docstring)."""
    if group not in GROUPS:
        raise ValueError(f"{option}: unknown group {group!r} (one of {', '.join(GROUPS)})")
    flag = Flag(option, help, group, type, metavar, const, also, none, repeat)
    return dataclasses.field(default=default, metadata={_METADATA_KEY: flag})


def declared_flags(config_class: type) -> Iterator[Flag]:
    """Every flag declared on ``config_class``'s fields, in declaration order."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    for field in fields.values():
        flag = field.metadata.get(_METADATA_KEY)
        if flag is None:
            continue
        if flag.also:
            default: Any = tuple(fields[name].default for name in (field.name, *flag.also))
        else:
            default = field.default
        yield dataclasses.replace(flag, name=field.name, default=default)


@dataclass(frozen=True)
class CollectorOptions:
    """The collectors' option values, one frozen instance per options class (a frozen dataclass
    of :func:`setting` fields that a collector module declares). The CLI keeps only the classes
    whose values differ from their defaults, so ``Config()`` equals the parsed default."""

    given: tuple[Any, ...] = ()

    def of(self, kind: type[_Options]) -> _Options:
        """The values of ``kind``'s flags as parsed; its defaults where none was given."""
        for value in self.given:
            if isinstance(value, kind):
                return value
        return kind()
