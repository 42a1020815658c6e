"""Reading a scenario: YAML text or file into a validated :class:`Scenario` (its parts from
``scenario.py``, its timeline's events from ``events.py``)."""

from __future__ import annotations

import dataclasses
import pathlib
from importlib import resources
from typing import Any

import yaml

from gpu_exporter import safeyaml
from gpu_exporter.simulator import schema as s
from gpu_exporter.simulator.errors import Invalid, ScenarioError
from gpu_exporter.simulator.events import parse_event
from gpu_exporter.simulator.scenario import BUILTIN_SOURCE, Scenario, parse_parts


def load_scenario(path: pathlib.Path | None) -> Scenario:
    """Read and validate a scenario file; ``None`` gives the built-in scenario."""
    if path is None:
        data = resources.files("gpu_exporter.simulator").joinpath("data/builtin.yaml")
        return loads_scenario(data.read_text(), BUILTIN_SOURCE)
    try:
        content = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(str(path), "(file)", exc.strerror or str(exc)) from None
    except UnicodeDecodeError as exc:
        where = f"invalid byte at offset {exc.start}"
        raise ScenarioError(str(path), "(file)", f"not UTF-8 text ({where})") from None
    return loads_scenario(content, str(path))


def loads_scenario(content: str, source: str = "<string>") -> Scenario:
    """Parse scenario YAML text; ``source`` names it in error messages."""
    return parse_scenario(load_yaml(content, source), source)


def load_yaml(content: str, source: str, *, aliases: bool = True) -> Any:
    """YAML text (a scenario file, or with ``aliases=False`` a request body, which needs none),
    bounded: aliases may not expand it beyond :data:`gpu_exporter.safeyaml.MAX_NODES` values."""
    try:
        return safeyaml.load(content, aliases=aliases)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ScenarioError(source, "(yaml)", f"{problem}{where}") from None
    except ValueError as exc:  # PyYAML's int() on a number of 4300+ digits
        raise ScenarioError(source, "(yaml)", f"unreadable value: {exc}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ScenarioError(source, "(yaml)", "collections nested too deeply") from None


def parse_scenario(data: Any, source: str = "<string>") -> Scenario:
    """Validate an already-parsed scenario mapping."""
    try:
        return dataclasses.replace(_scenario(data), source=source)
    except Invalid as exc:
        raise exc.at(source) from None


def _scenario(data: Any) -> Scenario:
    top, scenario = parse_parts(data)
    gpus = scenario.gpus
    timeline = tuple(
        parse_event(raw, s.item("timeline", i), gpus, timed=True)
        for i, raw in enumerate(s.sequence(top.get("timeline"), "timeline"))
    )
    return dataclasses.replace(scenario, timeline=timeline)
