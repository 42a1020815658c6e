"""The Prometheus rules: promtool accepts them, their unit tests pass, and they follow the kit's
conventions (for, severity, summary, templated description, runbook section per alert)."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest

from tests.conftest import require_binary

from .helpers import (
    ALERTING_RULES,
    COMPAT_RULES,
    RECORDING_RULES,
    RULE_TESTS,
    RUNBOOKS,
    alerts,
    load,
    rules,
)

LEVEL_METRIC_OPERATIONS = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")
RUNBOOK_URL = re.compile(
    r"^https://github\.com/gpu-exporter/gpu-exporter/blob/main/docs/runbooks\.md#([a-z0-9-]+)$"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("promtool"), *args], capture_output=True, text=True, check=False
    )


def test_promtool_check_rules_accepts_both_rule_files() -> None:
    result = promtool("check", "rules", str(RECORDING_RULES), str(ALERTING_RULES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_test_rules_passes(test_file: Any) -> None:
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


def test_recording_rules_are_named_level_metric_operations() -> None:
    for path in (RECORDING_RULES, ALERTING_RULES):
        for rule in rules(path):
            if "record" in rule:
                assert LEVEL_METRIC_OPERATIONS.match(rule["record"]), rule["record"]


def test_compat_rules_record_dcgm_exporter_names_or_our_own_levels() -> None:
    dcgm_name = re.compile(r"^DCGM_FI_(DEV|PROF)_[A-Z0-9_]+$")
    for rule in rules(COMPAT_RULES):
        name = rule["record"]
        assert dcgm_name.match(name) or LEVEL_METRIC_OPERATIONS.match(name), name


def test_every_recording_rule_has_an_expression_test() -> None:
    tested = " ".join(
        str(case["expr"])
        for path in RULE_TESTS
        for test in load(path)["tests"]
        for case in test.get("promql_expr_test", [])
    )
    for rule in rules(RECORDING_RULES):
        assert rule["record"] in tested, f"{rule['record']} has no promql_expr_test"


# The labels each recording-rule level may keep: target labels (instance, job, node) at the
# node levels, the level's own labels, nothing else. The device level keeps the device's labels
# (and a MIG instance's) but never gpu_info's identity labels.
TARGET = {"instance", "job", "node"}
LEVEL_LABELS = {
    "fleet": set(),
    "class": {"class"},
    "reason": {"reason"},
    "namespace": {"namespace"},
    "namespace_class": {"namespace", "class"},
    "queue": {"namespace", "queue"},
    "domain": {"domain"},
    "account": {"account"},
    "user": {"user"},
    "partition": {"partition"},
    "workload": {"namespace", "workload"},
    "instance": TARGET,
    "instance_reason": TARGET | {"reason"},
    "instance_domain": TARGET | {"domain"},
    "instance_namespace": TARGET | {"namespace"},
    "instance_queue": TARGET | {"namespace", "queue"},
    "instance_class": TARGET | {"class"},
    "instance_band": TARGET | {"band"},
}
IDENTITY_LABELS = {"model", "pci_bus_id", "driver_version", "mig_mode", "activity_source"}
IDENTITY_LABELS |= {"idle_source", "persistence_mode", "compute_mode", "serial", "vbios_version"}
LABEL_NAME = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="')


def test_recording_rule_levels_name_the_labels_they_keep() -> None:
    """A rule's level prefix says what one series is (fleet: one; instance: one per node): the
    expression tests' expected samples must carry no label the level does not name."""
    recorded = {
        rule["record"]
        for path in (RECORDING_RULES, ALERTING_RULES)
        for rule in rules(path)
        if "record" in rule
    }
    checked = 0
    for path in RULE_TESTS:
        for test in load(path)["tests"]:
            for case in test.get("promql_expr_test", []):
                names = [
                    name for name in recorded if re.search(rf"\b{re.escape(name)}\b", case["expr"])
                ]
                if len(names) != 1:
                    continue
                level = names[0].split(":")[0]
                for sample in case.get("exp_samples", []):
                    labels = set(LABEL_NAME.findall(sample["labels"].split("{", 1)[-1]))
                    if level in LEVEL_LABELS:
                        extra = labels - LEVEL_LABELS[level]
                    else:
                        extra = labels & IDENTITY_LABELS
                    assert not extra, f"{names[0]} keeps {sorted(extra)}: {sample['labels']}"
                    checked += 1
    assert checked > 20, "no recording-rule samples checked: did the test files move?"


def test_every_alert_has_for_severity_class_summary_description_and_runbook() -> None:
    runbooks = RUNBOOKS.read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#{2,3} (.+)$", runbooks, flags=re.MULTILINE)
    }
    names = [alert["alert"] for alert in alerts()]
    assert len(names) == len(set(names)), "duplicate alert names"
    for alert in alerts():
        name = alert["alert"]
        assert "for" in alert, f"{name}: no for:"
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), name
        assert "class" in alert["labels"] or "class" in alert["expr"], f"{name}: no class"
        annotations = alert["annotations"]
        assert annotations["summary"], name
        assert "{{" not in annotations["summary"], f"{name}: summary must be static"
        assert "{{ $labels." in annotations["description"], f"{name}: description not templated"
        match = RUNBOOK_URL.match(annotations["runbook_url"])
        assert match, f"{name}: runbook_url {annotations['runbook_url']}"
        assert match.group(1) == name.lower(), f"{name}: runbook anchor {match.group(1)}"
        assert match.group(1) in anchors, f"{name}: no section '## {name}' in docs/runbooks.md"


def test_every_alert_has_firing_and_non_firing_cases() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for test in load(path)["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    for alert in alerts():
        assert alert["alert"] in firing, f"{alert['alert']}: no firing test case"
        assert alert["alert"] in quiet, f"{alert['alert']}: no non-firing test case"


def test_xid_alerts_do_not_rely_on_increase_alone() -> None:
    """A new gpu_xid_errors_total series starts at its first Xid: increase() cannot see it."""
    for alert in alerts():
        if "gpu_xid_errors_total" in alert["expr"]:
            assert "unless" in alert["expr"], alert["alert"]
            assert "offset" in alert["expr"], alert["alert"]


def test_the_fatal_sxid_alert_does_not_rely_on_increase_alone() -> None:
    """gpu_nvswitch_sxid_errors_total is born with its first SXid too; a fatal SXid is often the
    only one. Its "new series" branch is guarded, as the Xid alerts are, by the SXid's own
    timestamp, so old counters seen by a new Prometheus do not page and a fatal SXid logged at
    boot, before the first scrape, does."""
    fatal = [
        alert
        for alert in alerts()
        if 'gpu_nvswitch_sxid_errors_total{severity="fatal"}' in alert["expr"]
    ]
    assert [alert["alert"] for alert in fatal] == ["GPUNVSwitchFatalError"]
    expr = fatal[0]["expr"]
    assert "unless" in expr
    assert "offset" in expr
    assert "time() - gpu_nvswitch_sxid_last_timestamp_seconds" in expr
