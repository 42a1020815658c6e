"""The plain-Prometheus scrape example finds the same pods, port and path as the ServiceMonitor and
adds `node` the same way. (Debian's promtool is built without Kubernetes service discovery, so it
cannot check this file; the structure is checked here.)"""

from __future__ import annotations

import re

import yaml

from .conftest import DEPLOY, container, daemonset, find
from .kustomize import Resource

SCRAPE = DEPLOY / "prometheus" / "scrape-config.yaml"


def relabel(rules: list[dict[str, str]], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus' keep/replace relabelling, enough for this file; None when dropped."""
    labels = dict(labels)
    for rule in rules:
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep" and not match:
            return None
        if action == "replace" and match:
            labels[rule["target_label"]] = match.expand(
                rule.get("replacement", "$1").replace("$1", r"\1")
            )
        assert action in ("keep", "replace"), action
    return labels


def test_scrape_config_targets_the_exporter_pods(base: list[Resource]) -> None:
    config = yaml.safe_load(SCRAPE.read_text())
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "gpu-exporter"
    assert job["metrics_path"] == "/metrics"
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod"
    assert sd["namespaces"]["names"] == [daemonset(base)["metadata"]["namespace"]]
    pod_labels = daemonset(base)["spec"]["template"]["metadata"]["labels"]
    port = container(base)["ports"][0]
    meta = {
        f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}": v
        for k, v in pod_labels.items()
    }
    meta |= {
        "__meta_kubernetes_pod_container_port_name": port["name"],
        "__meta_kubernetes_pod_node_name": "gpu-node-7",
    }
    kept = relabel(job["relabel_configs"], meta)
    assert kept is not None
    assert kept["node"] == "gpu-node-7"
    other_port = relabel(
        job["relabel_configs"], meta | {"__meta_kubernetes_pod_container_port_name": "x"}
    )
    assert other_port is None
    other_pod = relabel(
        job["relabel_configs"], {**meta, "__meta_kubernetes_pod_label_app_kubernetes_io_name": "x"}
    )
    assert other_pod is None
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert not targets & {"namespace", "pod", "container"}, "those labels name the workload"


def test_servicemonitor_adds_node_and_drops_clashing_target_labels(base: list[Resource]) -> None:
    (endpoint,) = find(base, "ServiceMonitor")["spec"]["endpoints"]
    rules = endpoint["relabelings"]
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
        "action": "replace",
    } in rules
    drop = [r for r in rules if r["action"] == "labeldrop"]
    assert len(drop) == 1
    for label in ("namespace", "pod", "container", "service", "endpoint"):
        assert re.fullmatch(drop[0]["regex"], label)
    assert not re.fullmatch(drop[0]["regex"], "node")
    assert not endpoint.get("honorLabels"), "honorLabels would stamp the exporter pod on series"
