"""The Prometheus Operator form is generated from the rule files, never kept by hand."""

from __future__ import annotations

import subprocess
import sys

import yaml

from .helpers import ALERTING_RULES, ALERTS, PRICE_RULES, RECORDING_RULES, load


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
    expected = (
        load(RECORDING_RULES)["groups"]
        + load(PRICE_RULES)["groups"]
        + load(ALERTING_RULES)["groups"]
    )
    assert resource["spec"]["groups"] == expected


def test_the_dcgm_compat_rules_are_generated_and_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ALERTS / "generate_dcgm_compat.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_dcgm_compat_component_holds_the_compat_rules() -> None:
    component = ALERTS.parent / "deploy" / "components" / "dcgm-compat" / "prometheusrule.yaml"
    resource = yaml.safe_load(component.read_text())
    assert resource["metadata"]["name"] == "gpu-exporter-dcgm-compat"
    assert resource["metadata"]["namespace"] == "gpu-exporter"
    assert resource["spec"]["groups"] == load(ALERTS / "dcgm_compat_rules.yml")["groups"]
