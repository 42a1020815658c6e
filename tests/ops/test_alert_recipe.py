"""docs/design.md's "Adding an alert" recipe, followed with a trivial alert in a copy of the
operations kit: after each step, the tool that step answers to accepts the alert, and an alert
whose generated files were not rewritten (step 5 skipped) is caught, naming the file."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import require_binary

from .helpers import ROOT

KIT = (
    "alerts",
    "dashboards",
    "deploy/monitoring",
    "deploy/components/dcgm-compat",
    "docs/runbooks.md",
    "docs/operations.md",
)
NAME = "GPURecipeTooHot"
ANCHOR = NAME.lower()
# Step 1: the rule, with for, severity, class, a static summary, a templated description and the
# runbook's address.
RULE = f"""
  - name: gpu-exporter.recipe
    rules:
      - alert: {NAME}
        expr: gpu_temperature_celsius{{sensor="gpu"}} > 95
        for: 5m
        labels:
          severity: warning
          class: hardware
        annotations:
          summary: A GPU runs hotter than 95 °C.
          description: >-
            GPU {{{{ $labels.gpu }}}} of {{{{ $labels.instance }}}} has been above 95 °C for
            5 minutes.
          runbook_url: https://github.com/gpu-exporter/gpu-exporter/blob/main/docs/runbooks.md#{ANCHOR}
"""
HOT = 'gpu_temperature_celsius{instance="n1:9445",job="gpu-exporter",gpu="2",sensor="gpu"}'
# Step 2: a case where it fires and one where it stays quiet.
RULE_TEST = f"""
rule_files:
  - ../alerting_rules.yml
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: '{HOT}'
        values: '90x3 97x10'
    alert_rule_test:
      - {{eval_time: 3m, alertname: {NAME}, exp_alerts: []}}
      - eval_time: 10m
        alertname: {NAME}
        exp_alerts:
          - exp_labels:
              {{instance: n1:9445, job: gpu-exporter, gpu: "2", sensor: gpu, severity: warning,
               class: hardware}}
            exp_annotations:
              summary: A GPU runs hotter than 95 °C.
              description: GPU 2 of n1:9445 has been above 95 °C for 5 minutes.
              runbook_url: https://github.com/gpu-exporter/gpu-exporter/blob/main/docs/runbooks.md#{ANCHOR}
"""
# Step 3: the runbook section.
RUNBOOK = f"""
## {NAME}

The GPU runs above 95 °C. Check the node's airflow and fans; drain it if it keeps climbing.
"""


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False)


def copy_of_the_kit(root: Path) -> Path:
    for part in KIT:
        source, target = ROOT / part, root / part
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return root


def test_an_alert_added_as_the_recipe_says_passes_every_tool_it_names(tmp_path: Path) -> None:
    promtool, amtool = require_binary("promtool"), require_binary("amtool")
    kit = copy_of_the_kit(tmp_path)
    alerts = kit / "alerts"
    generate = (sys.executable, str(alerts / "generate_prometheusrule.py"))
    sync = (sys.executable, str(kit / "deploy" / "monitoring" / "sync.py"))

    with (alerts / "alerting_rules.yml").open("a") as rules:
        rules.write(RULE)
    checked = run(promtool, "check", "rules", str(alerts / "alerting_rules.yml"))
    assert checked.returncode == 0, f"step 1: {checked.stdout}{checked.stderr}"

    (alerts / "tests" / "recipe_rules_test.yml").write_text(RULE_TEST)
    tested = run(promtool, "test", "rules", str(alerts / "tests" / "recipe_rules_test.yml"))
    assert tested.returncode == 0, f"step 2: {tested.stdout}{tested.stderr}"

    with (kit / "docs" / "runbooks.md").open("a") as runbooks:
        runbooks.write(RUNBOOK)
    headings = re.findall(r"^#{2,3} (.+)$", (kit / "docs" / "runbooks.md").read_text(), re.M)
    assert ANCHOR in {h.strip().lower() for h in headings}, "step 3: the runbook_url's section"

    # Step 4: the routing table's hardware-warning row names infra-tickets; the example routes
    # the alert's labels there.
    routed = run(
        amtool,
        "config",
        "routes",
        "test",
        f"--config.file={alerts / 'alertmanager.example.yml'}",
        "--verify.receivers=infra-tickets",
        f"alertname={NAME}",
        "severity=warning",
        "class=hardware",
        "instance=n1",
        "gpu=2",
    )
    assert routed.returncode == 0, f"step 4: {routed.stdout}{routed.stderr}"

    stale = run(*generate, "--check")
    assert stale.returncode == 1, "a rule file changed: the PrometheusRule must be stale"
    assert "prometheusrule.yaml is out of date" in stale.stderr, stale.stderr
    assert run(*generate).returncode == 0
    assert run(*generate, "--check").returncode == 0, "step 5: generated and current"
    assert run(*sync, "--check").returncode == 1, "the deploy copy lags the new PrometheusRule"
    assert run(*sync).returncode == 0
    assert run(*sync, "--check").returncode == 0, "step 5: make sync-monitoring's copy current"
    shipped = yaml.safe_load((kit / "deploy" / "monitoring" / "prometheusrule.yaml").read_text())
    names = [r.get("alert") for g in shipped["spec"]["groups"] for r in g["rules"]]
    assert NAME in names, "kustomize ships the new alert"
