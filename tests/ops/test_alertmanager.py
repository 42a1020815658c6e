"""The Alertmanager routing example: amtool accepts it, every routing case resolves to its
receivers, and the inhibitions mute what they should in a real Alertmanager."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from demo.stack import AlertmanagerProcess, load_yaml, wait_ready, webhook_alertmanager_config

from tests.conftest import require_binary

from .helpers import (
    ALERTMANAGER_CASES,
    ALERTMANAGER_EXAMPLE,
    OPERATIONS,
    alertmanager_binary,
    alerts,
)

CASES = load_yaml(ALERTMANAGER_CASES)


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("amtool"), *args], capture_output=True, text=True, check=False
    )


def test_amtool_check_config_accepts_the_example() -> None:
    result = amtool("check-config", str(ALERTMANAGER_EXAMPLE))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case", CASES["routes"], ids=lambda case: case["name"])
def test_route(case: dict[str, Any]) -> None:
    labels = [f"{key}={value}" for key, value in case["labels"].items()]
    result = amtool(
        "config",
        "routes",
        "test",
        f"--config.file={ALERTMANAGER_EXAMPLE}",
        f"--verify.receivers={','.join(case['receivers'])}",
        *labels,
    )
    assert result.returncode == 0, (
        f"{case['labels']} -> {result.stdout.strip()}, expected {case['receivers']}"
    )


def test_every_team_receiver_is_in_the_documented_namespace_mapping() -> None:
    operations = OPERATIONS.read_text()
    example = load_yaml(ALERTMANAGER_EXAMPLE)
    for receiver in example["receivers"]:
        if receiver["name"].startswith("team-"):
            assert f"`{receiver['name']}`" in operations, receiver["name"]


def routing_table() -> dict[str, tuple[str, str]]:
    """docs/operations.md's routing table: alert name (or ``Prefix*``) -> (class, receiver)."""
    operations = OPERATIONS.read_text()
    section = operations[operations.index("## Alert routing") : operations.index("### Namespace")]
    table: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        klass = re.findall(r"`([^`]+)`", cells[0])[0]
        receiver = re.findall(r"`([^`]+)`", cells[2])
        for name in re.findall(r"`([^`]+)`", cells[1]):
            if "team" not in cells[2]:
                table[name] = (klass, receiver[0])
            else:  # "`infra-tickets` as well as the namespace's team": both, in route order
                table[name] = (klass, "infra-tickets,team" if "as well as" in cells[2] else "team")
    return table


def documented_route(name: str, table: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    if name in table:
        return table[name]
    return next((v for k, v in table.items() if k.endswith("*") and name.startswith(k[:-1])), None)


@pytest.mark.parametrize("rule", alerts(), ids=lambda rule: str(rule["alert"]))
def test_every_alert_is_routed_as_the_operations_table_says(rule: dict[str, Any]) -> None:
    """The table in docs/operations.md is what operators read: each alert must be in it, and the
    example must send the alert's labels (severity, class) to the receiver the table names."""
    documented = documented_route(rule["alert"], routing_table())
    assert documented, f"{rule['alert']} is missing from docs/operations.md's routing table"
    klass, receiver = documented
    labels = {"alertname": rule["alert"], "instance": "n1", "gpu": "0"}
    labels |= {"severity": rule["labels"]["severity"], "class": rule["labels"].get("class", klass)}
    if receiver.endswith("team"):
        labels["namespace"], receiver = "ml-training", receiver.removesuffix("team") + "team-ml"
    result = amtool(
        "config",
        "routes",
        "test",
        f"--config.file={ALERTMANAGER_EXAMPLE}",
        f"--verify.receivers={receiver}",
        *(f"{key}={value}" for key, value in labels.items()),
    )
    assert result.returncode == 0, (
        f"{labels} -> {result.stdout.strip()}, docs/operations.md says {receiver}"
    )


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlertmanagerProcess]:
    binary = alertmanager_binary()
    workdir: Path = tmp_path_factory.mktemp("alertmanager")
    # Receivers point at a closed port: this test reads alert states, not notifications.
    config = webhook_alertmanager_config(load_yaml(ALERTMANAGER_EXAMPLE), "http://127.0.0.1:9")
    process = AlertmanagerProcess(binary, config, workdir)
    try:
        wait_ready(f"{process.url}/-/ready", process)
        yield process
    finally:
        process.stop()


def post_alerts(url: str, alerts: list[dict[str, str]]) -> None:
    now = datetime.now(UTC)
    body = [
        {
            "labels": labels,
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(minutes=10)).isoformat(),
        }
        for labels in alerts
    ]
    request = urllib.request.Request(
        f"{url}/api/v2/alerts",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def alert_states(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=10) as response:
        return list(json.loads(response.read().decode()))


@pytest.mark.parametrize("case", CASES["inhibitions"], ids=lambda case: case["name"])
def test_inhibition(alertmanager: AlertmanagerProcess, case: dict[str, Any]) -> None:
    post_alerts(alertmanager.url, case["firing"])
    instances = {alert["instance"] for alert in case["firing"]}

    def problems() -> list[str]:
        """What still contradicts the case; Alertmanager settles inhibitions asynchronously."""
        states = alert_states(alertmanager.url)
        found: list[str] = []
        for expect_muted, selectors in ((True, case["muted"]), (False, case["not_muted"])):
            for selector in selectors:
                matching = [
                    state
                    for state in states
                    if state["labels"].get("instance") in instances
                    and all(state["labels"].get(k) == v for k, v in selector.items())
                ]
                if not matching:
                    found.append(f"no posted alert matches {selector}")
                for state in matching:
                    if bool(state["status"]["inhibitedBy"]) != expect_muted:
                        verb = "should be" if expect_muted else "must not be"
                        found.append(f"{state['labels']} {verb} inhibited")
        return found

    deadline = time.monotonic() + 10
    while (remaining := problems()) and time.monotonic() < deadline:
        time.sleep(0.1)  # across a process boundary: Alertmanager offers no event to await
    assert not remaining, "; ".join(remaining)
