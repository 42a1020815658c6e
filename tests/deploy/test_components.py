"""Least privilege, as a cluster admin would read it: what the DaemonSet asks for, and that
turning a feature off (a component under deploy/components/) removes exactly that feature's grant
and changes nothing else."""

from __future__ import annotations

import copy
from typing import Any

from .conftest import ALL_OFF, COMPONENTS, FEATURE_OFF, container, daemonset
from .kustomize import Resource

# Feature-off component -> what it must take away: host paths, capabilities, exporter variables.
FEATURE_GRANTS: dict[str, dict[str, set[str]]] = {
    "no-kmsg": {
        "hostPath": set(),  # the kernel log is read through syslog(2): no device is mounted
        "capability": {"SYSLOG"},
        "env": {"GPU_EXPORTER_KMSG_PATH"},
        "adds": {"GPU_EXPORTER_KMSG=false"},  # the exporter is told, so the source is off
    },
    "no-container-memory": {
        "hostPath": {"/proc", "/var/log/pods"},
        "capability": set(),
        "env": {"GPU_EXPORTER_PROC_PATH", "GPU_EXPORTER_POD_LOGS_PATH"},
        "adds": {"GPU_EXPORTER_CONTAINER_MEMORY=false"},
    },
    "no-allocation": {
        "hostPath": {"/var/lib/kubelet/pod-resources"},
        "capability": set(),
        "env": {"GPU_EXPORTER_POD_RESOURCES_SOCKET"},
        "adds": {"GPU_EXPORTER_ALLOCATION=false"},
    },
    "no-prometheus-operator": {"hostPath": set(), "capability": set(), "env": set()},
    "no-network-policy": {"hostPath": set(), "capability": set(), "env": set()},
}
OPERATOR_GROUP = "monitoring.coreos.com"


def grants(resources: list[Resource]) -> dict[str, set[str]]:
    spec = daemonset(resources)["spec"]["template"]["spec"]
    caps = container(resources)["securityContext"].get("capabilities", {})
    return {
        "hostPath": {v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v},
        "capability": set(caps.get("add", [])),
        "env": {e["name"] for e in container(resources).get("env", [])},
    }


def without(resources: list[Resource], removed: dict[str, set[str]]) -> list[Resource]:
    """``resources`` with the DaemonSet stripped of ``removed`` by hand: what a component should
    produce."""
    out = copy.deepcopy(resources)
    spec = daemonset(out)["spec"]["template"]["spec"]
    names = {
        v["name"]
        for v in spec["volumes"]
        if v.get("hostPath", {}).get("path") in removed["hostPath"]
    }
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in names]
    main = container(out)
    main["volumeMounts"] = [m for m in main["volumeMounts"] if m["name"] not in names]
    main["env"] = [e for e in main["env"] if e["name"] not in removed["env"]]
    for setting in sorted(removed.get("adds", set())):
        name, _, value = setting.partition("=")
        main["env"].insert(0, {"name": name, "value": value})
    caps = main["securityContext"]["capabilities"]
    left = [c for c in caps.get("add", []) if c not in removed["capability"]]
    if left:
        caps["add"] = left
    else:
        caps.pop("add", None)
    return out


def test_every_feature_off_component_is_described() -> None:
    assert set(FEATURE_OFF) == set(FEATURE_GRANTS), "describe the component in FEATURE_GRANTS"


def test_the_default_install_asks_for_each_feature_grant(base: list[Resource]) -> None:
    have = grants(base)
    for component, removed in FEATURE_GRANTS.items():
        for kind, items in removed.items():
            if kind == "adds":
                continue
            assert items <= have[kind], f"{component}: base lacks {kind} {items - have[kind]}"


def test_each_feature_off_removes_its_grant_and_nothing_else(
    variants: dict[str, list[Resource]],
) -> None:
    base = variants["base"]
    for component, removed in FEATURE_GRANTS.items():
        expected = without(base, removed)
        if component == "no-prometheus-operator":
            expected = [r for r in expected if not r["apiVersion"].startswith(OPERATOR_GROUP)]
        if component == "no-network-policy":
            expected = [r for r in expected if r["kind"] != "NetworkPolicy"]
        assert variants[component] == expected, f"{component} changed more than its grant"


def test_all_features_off_asks_for_no_capability_and_only_its_state_dir(
    variants: dict[str, list[Resource]],
) -> None:
    have = grants(variants[ALL_OFF])
    assert have["capability"] == set()
    assert have["hostPath"] == {"/var/lib/gpu-exporter"}
    assert not any(r["apiVersion"].startswith(OPERATOR_GROUP) for r in variants[ALL_OFF])


def test_the_default_install_admits_scrapes_only_from_the_monitoring_namespace(
    base: list[Resource],
) -> None:
    (policy,) = [r for r in base if r["kind"] == "NetworkPolicy"]
    spec = policy["spec"]
    pod_labels = daemonset(base)["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items(), "selects no pod"
    assert spec["policyTypes"] == ["Ingress"], "egress must stay open (the exporter calls nobody)"
    (rule,) = spec["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    ports = {p["name"] for p in container(base)["ports"]}
    assert [p["port"] for p in rule["ports"]] == ["metrics"]
    assert "metrics" in ports


def test_all_features_off_keeps_no_network_policy(variants: dict[str, list[Resource]]) -> None:
    assert not [r for r in variants["no-network-policy"] if r["kind"] == "NetworkPolicy"]
    assert [r for r in variants["base"] if r["kind"] == "NetworkPolicy"]


def test_default_runtime_only_drops_the_runtime_class(variants: dict[str, list[Resource]]) -> None:
    expected = copy.deepcopy(variants["base"])
    del daemonset(expected)["spec"]["template"]["spec"]["runtimeClassName"]
    assert variants["default-runtime"] == expected


def test_privileged_is_opt_in_only(variants: dict[str, list[Resource]]) -> None:
    for name, resources in variants.items():
        security = container(resources)["securityContext"]
        if name == "kmsg-privileged":
            assert security["privileged"] is True
        else:
            assert security["privileged"] is False, name
            assert security["allowPrivilegeEscalation"] is False, name
    assert set(COMPONENTS) == set(FEATURE_OFF) | {
        "dcgm-compat",
        "dcgm",
        "default-runtime",
        "dra",
        "kmsg-privileged",
        "web-config",
    }


def test_least_privilege_pod(base: list[Resource]) -> None:
    pod = daemonset(base)["spec"]["template"]["spec"]
    main = container(base)
    security = main["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(security["capabilities"].get("add", [])) <= {"SYSLOG"}
    assert security["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for shared in ("hostPID", "hostIPC", "hostNetwork", "shareProcessNamespace"):
        assert not pod.get(shared), f"{shared}: host /proc is mounted instead"
    assert pod["automountServiceAccountToken"] is False
    assert not [
        r for r in base if r["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
    ]
    assert "initContainers" not in pod
    assert len(pod["containers"]) == 1


def test_gpu_access_without_taking_a_gpu(base: list[Resource]) -> None:
    pod = daemonset(base)["spec"]["template"]["spec"]
    main = container(base)
    resources: dict[str, Any] = main["resources"]
    for section in ("requests", "limits"):
        assert set(resources[section]) == {"cpu", "memory"}, "no nvidia.com/gpu: it would take one"
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"  # NVML only, no CUDA
    assert pod["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    node_name = next(e for e in main["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_rolling_update_keeps_at_most_one_pod_per_node(base: list[Resource]) -> None:
    strategy = daemonset(base)["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxSurge"] == 0  # two pods would share the Xid journal
    assert strategy["rollingUpdate"]["maxUnavailable"] == 1


def test_web_config_mounts_its_secret_and_speaks_https_and_nothing_else(
    variants: dict[str, list[Resource]],
) -> None:
    """What the web-config component must change, applied by hand to the default install."""
    expected = copy.deepcopy(variants["base"])
    spec = daemonset(expected)["spec"]["template"]["spec"]
    spec["volumes"].insert(  # kustomize puts new list items first
        0,
        {"name": "web-config", "secret": {"secretName": "gpu-exporter-web", "defaultMode": 0o400}},
    )
    main = container(expected)
    main["env"].insert(
        0, {"name": "GPU_EXPORTER_WEB_CONFIG_FILE", "value": "/etc/gpu-exporter/web/web.yml"}
    )
    main["volumeMounts"].insert(
        0, {"name": "web-config", "mountPath": "/etc/gpu-exporter/web", "readOnly": True}
    )
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        main[probe]["httpGet"]["scheme"] = "HTTPS"
    monitor = next(r for r in expected if r["kind"] == "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["scheme"] = "https"
    monitor["spec"]["endpoints"][0]["tlsConfig"] = {
        "ca": {"secret": {"name": "gpu-exporter-scrape", "key": "ca.crt"}},
        "serverName": "gpu-exporter.gpu-exporter.svc",
    }
    assert variants["web-config"] == expected, "web-config changed more than TLS and its Secret"


def test_dcgm_compat_only_adds_its_prometheusrule(variants: dict[str, list[Resource]]) -> None:
    def identities(resources: list[Resource]) -> set[tuple[str, str]]:
        return {(r["kind"], r["metadata"]["name"]) for r in resources}

    added = identities(variants["dcgm-compat"]) - identities(variants["base"])
    assert added == {("PrometheusRule", "gpu-exporter-dcgm-compat")}
    assert daemonset(variants["dcgm-compat"]) == daemonset(variants["base"]), "no exporter change"


def test_dra_adds_read_only_cdi_and_nvidia_caps_mounts_and_nothing_else(
    variants: dict[str, list[Resource]],
) -> None:
    """What the dra component must change, applied by hand to the default install."""
    expected = copy.deepcopy(variants["base"])
    spec = daemonset(expected)["spec"]["template"]["spec"]
    mounts = [
        ("cdi-run", "/var/run/cdi", "/var/run/cdi", "DirectoryOrCreate"),
        ("cdi-etc", "/etc/cdi", "/etc/cdi", "DirectoryOrCreate"),
        ("nvidia-caps", "/proc/driver/nvidia-caps", "/host/nvidia-caps", "Directory"),
    ]
    spec["volumes"][:0] = [
        {"name": name, "hostPath": {"path": host, "type": kind}} for name, host, _, kind in mounts
    ]
    main = container(expected)
    main["volumeMounts"][:0] = [
        {"name": name, "mountPath": path, "readOnly": True} for name, _, path, _ in mounts
    ]
    field = {"fieldRef": {"fieldPath": "metadata.namespace"}}
    main["env"][:0] = [
        {"name": "POD_NAMESPACE", "valueFrom": field},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "GPU_EXPORTER_SELF_POD", "value": "$(POD_NAMESPACE)/$(POD_NAME)"},
        {"name": "GPU_EXPORTER_CDI_SPEC_DIR", "value": "/var/run/cdi,/etc/cdi"},
        {"name": "GPU_EXPORTER_NVIDIA_CAPS_PATH", "value": "/host/nvidia-caps"},
    ]
    assert variants["dra"] == expected, "dra changed more than its read-only mounts and names"


def test_dcgm_points_at_the_operators_node_local_engine_and_grants_nothing(
    variants: dict[str, list[Resource]],
) -> None:
    """The dcgm component only tells the exporter where the engine is: no capability, mount,
    host network or Service of its own (the operator's nvidia-dcgm Service is node-local)."""
    expected = copy.deepcopy(variants["base"])
    container(expected)["env"].insert(
        0, {"name": "GPU_EXPORTER_DCGM_ADDRESS", "value": "nvidia-dcgm.gpu-operator.svc:5555"}
    )
    assert variants["dcgm"] == expected, "the dcgm component changed more than the address"
    assert grants(variants["dcgm"]) == {
        **grants(variants["base"]),
        "env": grants(variants["base"])["env"] | {"GPU_EXPORTER_DCGM_ADDRESS"},
    }
