"""Rendered variants of deploy/: the default install and each component applied to it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .kustomize import Resource, render

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPONENTS = sorted(p.name for p in (DEPLOY / "components").iterdir() if p.is_dir())
FEATURE_OFF = [name for name in COMPONENTS if name.startswith("no-")]
ALL_OFF = "all-features-off"


def write_overlay(directory: Path, components: list[str]) -> Path:
    """A user's overlay of deploy/ with ``components`` (kustomize wants relative paths)."""
    directory.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(DEPLOY, directory)
    lines = [
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "resources:",
        f"  - {base}",
    ]
    if components:
        lines.append("components:")
        lines += [f"  - {base}/components/{name}" for name in components]
    (directory / "kustomization.yaml").write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture(scope="session")
def variant_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Name -> kustomization directory: "base" is deploy/ itself."""
    root = tmp_path_factory.mktemp("overlays")
    dirs = {"base": DEPLOY}
    for name in COMPONENTS:
        dirs[name] = write_overlay(root / name, [name])
    dirs[ALL_OFF] = write_overlay(root / ALL_OFF, FEATURE_OFF)
    return dirs


@pytest.fixture(scope="session")
def variants(variant_dirs: dict[str, Path]) -> dict[str, list[Resource]]:
    return {name: render(directory) for name, directory in variant_dirs.items()}


@pytest.fixture(scope="session")
def base(variants: dict[str, list[Resource]]) -> list[Resource]:
    return variants["base"]


def find(resources: list[Resource], kind: str, name: str | None = None) -> Resource:
    matches = [
        r
        for r in resources
        if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def daemonset(resources: list[Resource]) -> Resource:
    return find(resources, "DaemonSet", "gpu-exporter")


def container(resources: list[Resource]) -> dict[str, Any]:
    containers = daemonset(resources)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["gpu-exporter"]
    return containers[0]
