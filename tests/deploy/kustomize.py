"""A small kustomize, for exactly the features deploy/ uses, so the tests need no kubectl.

Supported: ``resources`` (files and directories), ``components``, ``patches`` (strategic merge,
from ``path`` or inline ``patch``, with or without ``target``), ``namespace``,
``configMapGenerator`` with ``files`` and ``generatorOptions`` (``labels``,
``disableNameSuffixHash: true``). Anything else is refused, so a new kustomize feature in deploy/
cannot be silently ignored here. Where ``kubectl`` is installed, test_kustomize.py checks that
this renders exactly what ``kubectl kustomize`` does.

Strategic merge follows the Kubernetes patch strategy for the fields deploy/ patches: lists of
containers, env, volumes and ports merge on ``name``/``containerPort``, volumeMounts on
``mountPath``; other lists are replaced; ``null`` deletes a field; ``$patch: delete`` deletes a
list item or, at the top, the whole resource; new list items go first, as in kustomize.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]
KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
KNOWN_KEYS = {
    "apiVersion",
    "kind",
    "resources",
    "components",
    "patches",
    "namespace",
    "configMapGenerator",
    "generatorOptions",
}


class KustomizeError(Exception):
    pass


def kustomization_file(directory: Path) -> Path:
    for name in KUSTOMIZATION_NAMES:
        if (directory / name).is_file():
            return directory / name
    raise KustomizeError(f"{directory}: no kustomization file")


def load_yaml_documents(path: Path) -> list[Resource]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def render(directory: Path) -> list[Resource]:
    """The resources ``kubectl kustomize directory`` would print (in accumulation order)."""
    resources: list[Resource] = []
    _build(directory.resolve(), resources, expect_kind="Kustomization")
    return resources


def _build(directory: Path, resources: list[Resource], expect_kind: str) -> None:
    path = kustomization_file(directory)
    spec = yaml.safe_load(path.read_text()) or {}
    unknown = set(spec) - KNOWN_KEYS
    if unknown:
        raise KustomizeError(f"{path}: unsupported keys {sorted(unknown)}")
    kind = spec.get("kind", "Kustomization")
    if kind != expect_kind:
        raise KustomizeError(f"{path}: kind {kind}, expected {expect_kind}")
    for entry in spec.get("resources") or []:
        target = _inside(directory, entry, path)
        if target.is_dir():
            _build(target, resources, expect_kind="Kustomization")
        else:
            resources.extend(load_yaml_documents(target))
    for entry in spec.get("components") or []:
        _build(_inside(directory, entry, path, allow_outside=True), resources, "Component")
    resources.extend(_generate(directory, spec, path))
    for patch in spec.get("patches") or []:
        _apply_patch(directory, patch, resources, path)
    if "namespace" in spec:
        for resource in resources:
            if resource.get("kind") not in CLUSTER_SCOPED:
                resource.setdefault("metadata", {})["namespace"] = spec["namespace"]


def _inside(directory: Path, entry: str, source: Path, allow_outside: bool = False) -> Path:
    target = (directory / entry).resolve()
    if not target.exists():
        raise KustomizeError(f"{source}: {entry} does not exist")
    if target.is_file() and directory not in target.parents:
        raise KustomizeError(f"{source}: file {entry} is outside the kustomization root")
    if target.is_dir() and target in directory.parents and not allow_outside:
        raise KustomizeError(f"{source}: {entry} contains this kustomization (a cycle)")
    return target


def _generate(directory: Path, spec: dict[str, Any], source: Path) -> list[Resource]:
    generators = spec.get("configMapGenerator") or []
    options = spec.get("generatorOptions") or {}
    if set(options) - {"labels", "disableNameSuffixHash"}:
        raise KustomizeError(f"{source}: unsupported generatorOptions {sorted(options)}")
    if generators and options.get("disableNameSuffixHash") is not True:
        raise KustomizeError(f"{source}: name suffix hashes are not implemented here")
    out = []
    for generator in generators:
        if set(generator) - {"name", "files"}:
            raise KustomizeError(
                f"{source}: unsupported configMapGenerator keys {sorted(generator)}"
            )
        data = {}
        for entry in generator.get("files", []):
            key, _, file = entry.rpartition("=") if "=" in entry else ("", "", entry)
            data[key or Path(file).name] = _inside(directory, file, source).read_text()
        metadata: dict[str, Any] = {"name": generator["name"]}
        if options.get("labels"):
            metadata["labels"] = dict(options["labels"])
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    return out


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def _apply_patch(
    directory: Path, patch: dict[str, Any], resources: list[Resource], source: Path
) -> None:
    if set(patch) - {"path", "patch", "target"}:
        raise KustomizeError(f"{source}: unsupported patch keys {sorted(patch)}")
    if "path" in patch:
        documents = load_yaml_documents(_inside(directory, patch["path"], source))
    else:
        documents = [doc for doc in yaml.safe_load_all(patch["patch"]) if doc is not None]
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise KustomizeError(f"{source}: a patch must be one strategic-merge document")
    body = documents[0]
    target = patch.get("target")
    if target is not None:
        if set(target) - {"group", "version", "kind", "name", "namespace"}:
            raise KustomizeError(f"{source}: unsupported target keys {sorted(target)}")
        matches = [r for r in resources if _matches_target(r, target)]
    else:
        matches = [r for r in resources if _same_id(r, body)]
        if not matches:
            raise KustomizeError(f"{source}: patch matches no resource: {_id(body)}")
    for resource in matches:
        index = next(i for i, r in enumerate(resources) if r is resource)
        if body.get("$patch") == "delete":
            del resources[index]
            continue
        patched = strategic_merge(resource, {k: v for k, v in body.items() if k != "metadata"})
        patched["metadata"] = strategic_merge(
            resource.get("metadata", {}),
            {k: v for k, v in body.get("metadata", {}).items() if k not in ("name", "namespace")},
        )
        resources[index] = patched


def _id(resource: Resource) -> tuple[str, str, str, str]:
    metadata = resource.get("metadata", {})
    return (
        _group(resource.get("apiVersion", "")),
        resource.get("kind", ""),
        metadata.get("name", ""),
        metadata.get("namespace", ""),
    )


def _same_id(resource: Resource, patch: Resource) -> bool:
    group, kind, name, namespace = _id(patch)
    r_group, r_kind, r_name, r_namespace = _id(resource)
    return (group, kind, name) == (r_group, r_kind, r_name) and (
        not namespace or namespace == r_namespace
    )


def _matches_target(resource: Resource, target: dict[str, str]) -> bool:
    group, kind, name, namespace = _id(resource)
    return (
        target.get("group", group) == group
        and target.get("kind", kind) == kind
        and target.get("name", name) == name
        and target.get("namespace", namespace) == namespace
    )


def strategic_merge(original: Any, patch: Any, field: str = "") -> Any:
    """``patch`` applied to ``original`` (neither is modified)."""
    if isinstance(patch, dict) and isinstance(original, dict):
        merged = copy.deepcopy(original)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = strategic_merge(merged[key], value, key)
            else:
                merged[key] = _strip_directives(value)
        return merged
    if isinstance(patch, list) and isinstance(original, list) and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        merged_list = copy.deepcopy(original)
        added: list[Any] = []
        for item in patch:
            if key not in item:
                raise KustomizeError(f"{field}: patch item without merge key {key}: {item}")
            index = next((i for i, o in enumerate(merged_list) if o.get(key) == item[key]), None)
            if item.get("$patch") == "delete":
                if index is not None:
                    del merged_list[index]
            elif index is None:
                added.append(_strip_directives(item))
            else:
                merged_list[index] = strategic_merge(merged_list[index], item, field)
        return added + merged_list  # as kustomize does: new items first, in the patch's order
    return _strip_directives(patch)


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return copy.deepcopy(value)
