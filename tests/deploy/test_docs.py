"""docs/deploy.md lists every grant the DaemonSet has, every component, and the sizing in force."""

from __future__ import annotations

from .conftest import COMPONENTS, ROOT, container, daemonset
from .kustomize import Resource

DOC = (ROOT / "docs" / "deploy.md").read_text()


def security_section() -> str:
    return DOC.split("## Security", 1)[1].split("\n## ", 1)[0]


def test_every_grant_is_in_the_security_table(variants: dict[str, list[Resource]]) -> None:
    table = security_section()
    for name, resources in variants.items():
        pod = daemonset(resources)["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            if "hostPath" in volume:
                assert f"hostPath `{volume['hostPath']['path']}" in table, (name, volume)
        security = container(resources)["securityContext"]
        for capability in security["capabilities"].get("add", []):
            assert f"CAP_{capability}" in table, capability
        assert f"UID {security['runAsUser']}" in table
        if "runtimeClassName" in pod:
            assert f"runtimeClassName: {pod['runtimeClassName']}" in table


def test_every_component_is_documented() -> None:
    for name in COMPONENTS:
        assert f"`{name}`" in DOC, f"components/{name} is not in docs/deploy.md"


def test_the_documented_resources_are_the_manifests(base: list[Resource]) -> None:
    resources = container(base)["resources"]
    requests, limits = resources["requests"], resources["limits"]
    assert (
        f"Requests `cpu: {requests['cpu']}, memory: {requests['memory']}`; "
        f"limits `cpu: {limits['cpu']}, memory: {limits['memory']}`" in DOC
    )
