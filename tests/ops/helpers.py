"""Shared helpers for the operations-kit tests: the kit's files and the binaries they need."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"
RECORDING_RULES = ALERTS / "recording_rules.yml"
ALERTING_RULES = ALERTS / "alerting_rules.yml"
PRICE_RULES = ALERTS / "price_rules.yml"
COMPAT_RULES = ALERTS / "dcgm_compat_rules.yml"
RULE_TESTS = sorted((ALERTS / "tests").glob("*_rules_test.yml"))
ALERTMANAGER_EXAMPLE = ALERTS / "alertmanager.example.yml"
ALERTMANAGER_CASES = ALERTS / "tests" / "alertmanager_test.yml"
DASHBOARDS = ROOT / "dashboards"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
OPERATIONS = ROOT / "docs" / "operations.md"

# Grafana variables replaced by values a test Prometheus can evaluate.
DASHBOARD_VARIABLES = {
    "$__rate_interval": "15s",
    "$__interval": "5s",
    "$__range_s": "30",  # before $__range, which it starts with
    "$__range": "30s",
}


def alertmanager_binary() -> str:
    """Alertmanager's server binary; Debian names it prometheus-alertmanager."""
    return shutil.which("alertmanager") or require_binary("prometheus-alertmanager")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def rules(path: Path) -> list[dict[str, Any]]:
    return [rule for group in load(path)["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules(ALERTING_RULES) if "alert" in rule]


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, PromQL with Grafana variables substituted) for every target."""
    found = []
    for name, dashboard in dashboards().items():
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                found.append((name, panel["title"], substitute(target["expr"])))
    return found


def substitute(expr: str) -> str:
    for variable, value in DASHBOARD_VARIABLES.items():
        expr = expr.replace(variable, value)
    # Template variables ($instance, $gpu, $namespace) match everything ("All").
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)
