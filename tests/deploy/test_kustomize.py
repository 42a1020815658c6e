"""deploy/ builds with kustomize: everything listed exists, nothing is left out, the components
patch what they claim, and the operations kit's copies are current."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import COMPONENTS, DEPLOY
from .kustomize import Resource, kustomization_file, render

NOT_MANIFESTS = {
    "prometheus/scrape-config.yaml",  # a prometheus.yml fragment, not a Kubernetes object
    "image/requirements.txt",
    "image/build-requirements.txt",
}


def kustomization_dirs() -> list[Path]:
    return sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))


def referenced_files() -> set[Path]:
    files = set()
    for directory in kustomization_dirs():
        path = kustomization_file(directory)
        files.add(path)
        spec = yaml.safe_load(path.read_text())
        entries = list(spec.get("resources") or [])
        entries += [p["path"] for p in spec.get("patches") or [] if "path" in p]
        for generator in spec.get("configMapGenerator") or []:
            entries += [f.rpartition("=")[2] for f in generator.get("files", [])]
        for entry in entries:
            target = (directory / entry).resolve()
            assert target.exists(), f"{path}: {entry} does not exist"
            if target.is_file():
                files.add(target)
    return files


def test_every_manifest_in_deploy_is_used() -> None:
    used = referenced_files()
    for path in DEPLOY.rglob("*.yaml"):
        relative = path.relative_to(DEPLOY).as_posix()
        if relative not in NOT_MANIFESTS:
            assert path.resolve() in used, f"deploy/{relative} is in no kustomization"


def test_every_component_is_a_kustomize_component() -> None:
    for name in COMPONENTS:
        spec = yaml.safe_load(kustomization_file(DEPLOY / "components" / name).read_text())
        assert spec["kind"] == "Component", name
        assert spec["apiVersion"] == "kustomize.config.k8s.io/v1alpha1", name


def test_the_default_install_has_the_expected_objects(base: list[Resource]) -> None:
    kinds = sorted((r["kind"], r["metadata"]["name"]) for r in base if r["kind"] != "ConfigMap")
    expected = [
        ("DaemonSet", "gpu-exporter"),
        ("Namespace", "gpu-exporter"),
        ("NetworkPolicy", "gpu-exporter-scrape-only"),
        ("Service", "gpu-exporter"),
        ("ServiceAccount", "gpu-exporter"),
        ("ServiceMonitor", "gpu-exporter"),
    ]
    assert [k for k in kinds if k[0] != "PrometheusRule"] == expected
    for resource in base:
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == "gpu-exporter", resource["kind"]


def test_components_compose_in_any_order(tmp_path: Path) -> None:
    from .conftest import FEATURE_OFF, write_overlay

    forward = render(write_overlay(tmp_path / "a", FEATURE_OFF))
    backward = render(write_overlay(tmp_path / "b", FEATURE_OFF[::-1]))
    # Variables a component adds land in component order; the set is what must not differ.
    assert _env_sorted(forward) == _env_sorted(backward)


def _env_sorted(resources: list[Resource]) -> list[Resource]:
    for resource in resources:
        if resource["kind"] != "DaemonSet":
            continue
        for each in resource["spec"]["template"]["spec"]["containers"]:
            each["env"] = sorted(each.get("env", []), key=lambda variable: variable["name"])
    return resources


def test_this_renderer_matches_kubectl_kustomize(
    variant_dirs: dict[str, Path], variants: dict[str, list[Resource]]
) -> None:
    """Only where kubectl is installed: the pure-Python renderer is checked against the real one."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the structural renderer alone is used")
    for name, directory in variant_dirs.items():
        result = subprocess.run(
            [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, f"{name}: {result.stderr}"
        real = [d for d in yaml.safe_load_all(result.stdout) if d is not None]
        key = lambda r: (r["kind"], r["metadata"]["name"])  # noqa: E731
        assert sorted(real, key=key) == sorted(variants[name], key=key), name


def load_sync():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("deploy_sync", DEPLOY / "monitoring" / "sync.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_monitoring_copies_match_the_operations_kit() -> None:
    problems = load_sync().stale()
    assert not problems, f"{problems}: run python deploy/monitoring/sync.py"


def test_dashboards_are_configmaps_for_grafanas_sidecar(base: list[Resource]) -> None:
    import json

    sync = load_sync()
    sources = (
        sorted(sync.DASHBOARD_SOURCES.glob("*.json")) if sync.DASHBOARD_SOURCES.is_dir() else []
    )
    maps = {r["metadata"]["name"]: r for r in base if r["kind"] == "ConfigMap"}
    assert set(maps) == {sync.configmap_name(p) for p in sources}
    for source in sources:
        configmap = maps[sync.configmap_name(source)]
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        key = sync.configmap_key(source)
        assert configmap["data"] == {key: source.read_text()}
        json.loads(configmap["data"][key])
        assert len(source.read_bytes()) < 900_000, "ConfigMaps hold at most 1 MiB"
