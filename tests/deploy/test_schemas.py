"""Every object deploy/ renders, in every variant, is valid for current Kubernetes releases
(kubernetes-validate's bundled OpenAPI schemas, strict: unknown fields are errors). The
Prometheus Operator's custom resources have no bundled schema; they are checked structurally,
and a PrometheusRule's rules also by promtool."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require_binary

from .kustomize import Resource

try:
    import kubernetes_validate
except ImportError:  # a dev dependency: make test installs it
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip("pip install kubernetes-validate (a dev dependency)", allow_module_level=True)

OLDEST = "1.29.0"  # pod-resources List is GA since 1.28; RuntimeClass since 1.20
OPERATOR_GROUP = "monitoring.coreos.com"
DURATION = re.compile(
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
RELABEL_ACTIONS = {
    "replace",
    "keep",
    "drop",
    "hashmod",
    "labelmap",
    "labeldrop",
    "labelkeep",
    "lowercase",
    "uppercase",
    "keepequal",
    "dropequal",
}


def versions() -> list[str]:
    """Every Kubernetes release kubernetes-validate ships schemas for, from OLDEST on."""
    from kubernetes_validate.utils import all_versions, major_minor

    shipped = sorted(set(all_versions()), key=lambda v: tuple(int(x) for x in v.split(".")))
    return [v for v in shipped if major_minor(v) >= major_minor(OLDEST)]


def builtin(resource: Resource) -> bool:
    return not resource["apiVersion"].startswith(OPERATOR_GROUP + "/")


def test_a_current_release_is_covered() -> None:
    latest = kubernetes_validate.latest_version()
    assert versions()[-1].startswith(latest), versions()
    assert tuple(int(x) for x in latest.split(".")[:2]) >= (1, 31)


def test_every_builtin_object_validates_on_the_latest_release(
    variants: dict[str, list[Resource]],
) -> None:
    latest = versions()[-1]
    for name, resources in variants.items():
        for resource in filter(builtin, resources):
            try:
                kubernetes_validate.validate(resource, latest, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name}: {resource['kind']} {resource['metadata']['name']}: {exc}")


@pytest.mark.parametrize("version", versions())
def test_the_default_install_validates_on_each_supported_release(
    base: list[Resource], version: str
) -> None:
    for resource in filter(builtin, base):
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{version}: {resource['kind']} {resource['metadata']['name']}: {exc}")


def check_metadata(resource: Resource) -> None:
    assert resource["apiVersion"] == f"{OPERATOR_GROUP}/v1"
    assert set(resource) <= {"apiVersion", "kind", "metadata", "spec"}
    metadata = resource["metadata"]
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", metadata["name"])
    assert metadata["namespace"] == "gpu-exporter"
    for key in ("labels", "annotations"):
        assert all(isinstance(v, str) for v in metadata.get(key, {}).values()), key


def check_relabelings(relabelings: list[dict[str, Any]]) -> None:
    for rule in relabelings:
        assert set(rule) <= {
            "sourceLabels",
            "separator",
            "targetLabel",
            "regex",
            "modulus",
            "replacement",
            "action",
        }, rule
        assert rule.get("action", "replace").lower() in RELABEL_ACTIONS, rule
        re.compile(rule.get("regex", "(.*)"))
        if rule.get("action", "replace") == "replace":
            assert rule.get("targetLabel"), rule


def test_servicemonitor_structure(variants: dict[str, list[Resource]]) -> None:
    monitors = [r for rs in variants.values() for r in rs if r["kind"] == "ServiceMonitor"]
    assert monitors, "the default install ships a ServiceMonitor"
    for monitor in monitors:
        check_metadata(monitor)
        spec = monitor["spec"]
        assert set(spec) <= {
            "selector",
            "namespaceSelector",
            "endpoints",
            "jobLabel",
            "targetLabels",
            "podTargetLabels",
            "sampleLimit",
        }
        assert spec["selector"]["matchLabels"]
        assert spec["namespaceSelector"] == {"matchNames": ["gpu-exporter"]}
        for endpoint in spec["endpoints"]:
            assert set(endpoint) <= {
                "port",
                "path",
                "scheme",
                "interval",
                "scrapeTimeout",
                "honorLabels",
                "relabelings",
                "metricRelabelings",
                "tlsConfig",
                "basicAuth",
            }
            tls = endpoint.get("tlsConfig", {})
            assert set(tls) <= {"ca", "cert", "keySecret", "serverName", "insecureSkipVerify"}
            assert ("tlsConfig" in endpoint) == (endpoint.get("scheme") == "https")
            assert DURATION.match(endpoint["interval"])
            assert DURATION.match(endpoint["scrapeTimeout"])
            check_relabelings(endpoint.get("relabelings", []))


def prometheus_rules(variants: dict[str, list[Resource]]) -> list[Resource]:
    return [r for r in variants["base"] if r["kind"] == "PrometheusRule"]


def test_prometheusrule_structure_and_promql(
    variants: dict[str, list[Resource]], tmp_path: Path
) -> None:
    rules = prometheus_rules(variants)
    if not rules:
        pytest.skip("no PrometheusRule yet: alerts/prometheusrule.yaml does not exist")
    promtool = require_binary("promtool")
    for rule in rules:
        check_metadata(rule)
        assert set(rule["spec"]) == {"groups"}
        for group in rule["spec"]["groups"]:
            assert group["name"]
            assert group["rules"]
            for item in group["rules"]:
                assert ("alert" in item) != ("record" in item), item
                assert isinstance(item["expr"], str)
                assert item["expr"].strip()
                if "for" in item:
                    assert DURATION.match(item["for"]), item
        path = tmp_path / f"{rule['metadata']['name']}.rules.yaml"
        path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        result = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, f"promtool check rules: {result.stdout}{result.stderr}"
