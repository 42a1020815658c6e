"""The Grafana dashboards: generated, well-formed, a unit on every panel, every query parses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import require_binary

from .helpers import DASHBOARDS, dashboard_queries, dashboards, panels

PANEL_TYPES = {"timeseries", "stat", "table", "bargauge", "row"}


def test_dashboards_are_built_by_the_script_and_current() -> None:
    result = subprocess.run(
        [sys.executable, str(DASHBOARDS / "build.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert set(dashboards()) == {
        "gpu-fleet-efficiency.json",
        "gpu-node-detail.json",
        "gpu-health.json",
        "gpu-cost.json",
    }


def test_dashboards_follow_grafana_conventions() -> None:
    uids = set()
    for name, dashboard in dashboards().items():
        assert dashboard["uid"] not in uids, name
        uids.add(dashboard["uid"])
        assert dashboard["schemaVersion"] >= 36, name
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource", name
        assert variables["datasource"]["query"] == "prometheus", name
        ids = [panel["id"] for panel in panels(dashboard)]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        for panel in panels(dashboard):
            assert panel["type"] in PANEL_TYPES, f"{name}: {panel['title']}: {panel['type']}"
            if panel["type"] == "row":
                continue
            assert panel["fieldConfig"]["defaults"].get("unit"), f"{name}: {panel['title']}"
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], f"{name}: {panel['title']}: no query"
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}"


def test_the_fleet_dashboard_has_the_panels_operators_ask_for() -> None:
    fleet = dashboards()["gpu-fleet-efficiency.json"]
    by_title = {panel["title"]: panel for panel in panels(fleet)}
    both = " ".join(t["expr"] for t in by_title["Allocation and SM activity"]["targets"])
    assert "fleet:gpu_allocated:ratio_rate5m" in both
    assert "fleet:gpu_sm_active:ratio_rate5m" in both
    assert "Longest idle allocations" in by_title
    assert any("GPU-hours by namespace" in title for title in by_title)
    assert "NVML utilisation against SM activity" in by_title
    node = dashboards()["gpu-node-detail.json"]
    assert any("MIG" in panel["title"] for panel in panels(node))


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """promtool parses each query (variables substituted) as a rule expression."""
    queries = dashboard_queries()
    rules = {
        "groups": [
            {
                "name": "dashboard-queries",
                "rules": [
                    {"record": f"dashboard:query_{i}:check", "expr": expr}
                    for i, (_, _, expr) in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        [require_binary("promtool"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
