"""The Prometheus Operator form is generated from the rule files, never kept by hand."""

from __future__ import annotations

import subprocess
import sys

import yaml

from .helpers import ALERTING_RULES, ALERTS, RECORDING_RULES, load


def test_prometheusrule_is_generated_and_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ALERTS / "generate_prometheusrule.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_prometheusrule_groups_equal_the_rule_files() -> None:
    resource = yaml.safe_load((ALERTS / "prometheusrule.yaml").read_text())
    assert resource["apiVersion"] == "monitoring.coreos.com/v1"
    assert resource["kind"] == "PrometheusRule"
    expected = load(RECORDING_RULES)["groups"] + load(ALERTING_RULES)["groups"]
    assert resource["spec"]["groups"] == expected
