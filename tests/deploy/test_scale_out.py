"""deploy/scale-out/: sharded vmagent and Prometheus-agent scrapers. Their objects validate, each
shard's config keeps what the plain scrape config keeps and, across the shards, every exporter
exactly once (hashmod on the node name), and vmagent accepts its config."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require_binary

from .conftest import DEPLOY
from .kustomize import Resource, render
from .test_prometheus_config import SCRAPE

SCALE_OUT = DEPLOY / "scale-out"
NODES = [f"gpu-node-{i}" for i in range(200)]
# Each scraper: its StatefulSet, its config file, how the file names this pod's shard.
SCRAPERS = {
    "gpu-exporter-vmagent": (SCALE_OUT / "vmagent-scrape.yml", "%{SHARD}"),
    "gpu-exporter-prometheus-agent": (SCALE_OUT / "prometheus-agent.yml", "SHARD_NUMBER"),
}


@pytest.fixture(scope="module")
def resources() -> list[Resource]:
    return render(SCALE_OUT)


def shard_config(path: Path, placeholder: str, shard: int) -> dict[str, Any]:
    """The config one pod runs: its shard number where the file has the placeholder."""
    loaded: dict[str, Any] = yaml.safe_load(path.read_text().replace(placeholder, str(shard)))
    return loaded


def hashmod(value: str, modulus: int) -> int:
    """Prometheus' and vmagent's hashmod: the md5's last 8 bytes, big-endian, mod modulus."""
    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus


def relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str] | None:
    """keep / replace / hashmod, enough for these files; None when the target is dropped."""
    labels = dict(labels)
    for rule in rules:
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule["source_labels"])
        action = rule.get("action", "replace")
        if action == "hashmod":
            labels[rule["target_label"]] = str(hashmod(value, int(rule["modulus"])))
            continue
        match = re.fullmatch(str(rule.get("regex", "(.*)")), value)
        if action == "keep" and not match:
            return None
        if action == "replace" and match:
            labels[rule["target_label"]] = match.expand(
                str(rule.get("replacement", "$1")).replace("$1", r"\1")
            )
        assert action in ("keep", "replace"), action
    return labels


def exporter_target(node: str) -> dict[str, str]:
    return {
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "gpu-exporter",
        "__meta_kubernetes_pod_container_port_name": "metrics",
        "__meta_kubernetes_pod_node_name": node,
    }


def test_every_object_validates_on_the_latest_release(resources: list[Resource]) -> None:
    import kubernetes_validate  # a dev dependency, as in test_schemas.py

    from .test_schemas import versions

    for resource in resources:
        try:
            kubernetes_validate.validate(resource, versions()[-1], strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{resource['kind']} {resource['metadata']['name']}: {exc}")


def test_every_exporter_is_scraped_by_exactly_one_shard(resources: list[Resource]) -> None:
    for name, (path, placeholder) in SCRAPERS.items():
        (statefulset,) = [
            r for r in resources if r["kind"] == "StatefulSet" and r["metadata"]["name"] == name
        ]
        shards = statefulset["spec"]["replicas"]
        assert shards >= 2, name
        owners: dict[str, list[int]] = {node: [] for node in NODES}
        for shard in range(shards):
            (job,) = shard_config(path, placeholder, shard)["scrape_configs"]
            for node in NODES:
                kept = relabel(job["relabel_configs"], exporter_target(node))
                if kept is not None:
                    assert kept["node"] == node
                    owners[node].append(shard)
        unowned = [node for node, shards_of in owners.items() if len(shards_of) != 1]
        assert not unowned, f"{name}: nodes scraped by no shard or by several: {unowned[:5]}"
        per_shard = [sum(1 for s in owners.values() if s == [i]) for i in range(shards)]
        assert min(per_shard) > len(NODES) / shards / 2, f"{name}: shards unbalanced {per_shard}"


def test_a_shard_keeps_what_the_plain_scrape_config_keeps() -> None:
    (plain,) = yaml.safe_load(SCRAPE.read_text())["scrape_configs"]
    for name, (path, placeholder) in SCRAPERS.items():
        (job,) = shard_config(path, placeholder, 0)["scrape_configs"]
        for key in ("job_name", "metrics_path", "kubernetes_sd_configs"):
            assert job[key] == plain[key], f"{name}: {key}"
        sharding = [r for r in job["relabel_configs"] if "__tmp_shard" in str(r)]
        rest = [r for r in job["relabel_configs"] if r not in sharding]
        assert rest == plain["relabel_configs"], f"{name}: differs beyond the shard's keep"
        other_port = exporter_target("gpu-node-1") | {
            "__meta_kubernetes_pod_container_port_name": "x"
        }
        assert relabel(job["relabel_configs"], other_port) is None


def test_the_scrapers_write_to_the_same_store(resources: list[Resource]) -> None:
    urls = set()
    for name in SCRAPERS:
        (statefulset,) = [
            r for r in resources if r["kind"] == "StatefulSet" and r["metadata"]["name"] == name
        ]
        spec = statefulset["spec"]["template"]["spec"]
        containers = spec.get("initContainers", []) + spec["containers"]
        env = {e["name"]: e for c in containers for e in c.get("env", [])}
        assert env["SHARD"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.labels['apps.kubernetes.io/pod-index']"
        ), name
        urls.add(env["REMOTE_WRITE_URL"]["value"])
    assert len(urls) == 1


def test_vmagent_accepts_its_shard_config() -> None:
    vmagent = require_binary("vmagent")
    config, _ = SCRAPERS["gpu-exporter-vmagent"]
    result = subprocess.run(
        [vmagent, "-dryRun", f"-promscrape.config={config}", "-loggerLevel=ERROR"],
        capture_output=True,
        text=True,
        env={**os.environ, "SHARD": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
