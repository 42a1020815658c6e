"""The DaemonSet speaks the exporter's real command line: flags, defaults, port, probes, mounts.

Its args and GPU_EXPORTER_* variables go through the real parser (``cli.parse_config``), and
every host mount must sit exactly where the resulting Config looks. A renamed flag, a changed
default or a moved mount fails here, in every variant (each component applied).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.cli import build_parser, env_name, parse_config
from gpu_exporter.config import Config
from gpu_exporter.http.server import make_web_app

from .conftest import container, daemonset, find
from .kustomize import Resource

ENV_PREFIX = "GPU_EXPORTER_"


def parser_options() -> dict[str, argparse.Action]:
    return {o: a for a in build_parser()._actions for o in a.option_strings}


def env_options() -> dict[str, str]:
    """GPU_EXPORTER_* variable -> its flag, for every flag the parser has."""
    out = {}
    for action in build_parser()._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in ("help", "version"):
            out[env_name(longs[0])] = longs[0]
    return out


# Each host mount the DaemonSet may have: volume name -> (host path, flag, Config attribute,
# whether the flag names the mounted path itself, a file inside it, or (a repeatable flag) has
# it among its values, read-only).
HOST_MOUNTS: dict[str, tuple[str, str, str, str, bool]] = {
    "pod-resources": (
        "/var/lib/kubelet/pod-resources",
        "--pod-resources-socket",
        "pod_resources_socket",
        "parent",
        True,
    ),
    "host-proc": ("/proc", "--proc-path", "proc_path", "same", True),
    "state": ("/var/lib/gpu-exporter", "--state-dir", "state_dir", "same", False),
    "pod-logs": ("/var/log/pods", "--pod-logs-path", "pod_logs_path", "same", True),
    "cdi-run": ("/var/run/cdi", "--cdi-spec-dir", "cdi_spec_dirs", "member", True),
    "cdi-etc": ("/etc/cdi", "--cdi-spec-dir", "cdi_spec_dirs", "member", True),
    "nvidia-caps": (
        "/proc/driver/nvidia-caps",
        "--nvidia-caps-path",
        "nvidia_caps_path",
        "same",
        True,
    ),
}


def exporter_env(spec: dict[str, Any]) -> dict[str, str]:
    env = {}
    for item in spec.get("env", []):
        if item["name"].startswith(ENV_PREFIX):
            assert "value" in item, f"{item['name']}: set it with a literal value"
            env[item["name"]] = item["value"]
    return env


def config_of(resources: list[Resource]) -> Config:
    """What the exporter in this DaemonSet would run with: its args and env through the CLI."""
    spec = container(resources)
    return parse_config(spec.get("args", []), environ=exporter_env(spec))


def test_every_arg_is_a_real_flag(variants: dict[str, list[Resource]]) -> None:
    options = parser_options()
    for name, resources in variants.items():
        spec = container(resources)
        assert "command" not in spec, f"{name}: keep the image's entrypoint (gpu-exporter)"
        for arg in spec.get("args", []):
            option = arg.partition("=")[0]
            assert option in options, f"{name}: {arg} is not a flag"
            assert "=" in arg, f"{name}: write {arg} as --flag=value, one arg per flag"


def test_every_exporter_variable_is_a_real_flag(variants: dict[str, list[Resource]]) -> None:
    known = env_options()
    for name, resources in variants.items():
        for variable in exporter_env(container(resources)):
            assert variable in known, f"{name}: {variable} matches no flag of gpu-exporter"


def test_the_configuration_parses_and_is_not_simulated(
    variants: dict[str, list[Resource]],
) -> None:
    for name, resources in variants.items():
        config = config_of(resources)  # a UsageError here is a bad flag or value
        assert config.simulator is None, f"{name}: the DaemonSet must not run --simulate"
        assert config.log_format == "json", f"{name}: log JSON so log pipelines can parse it"


def test_the_container_port_is_the_listen_port(variants: dict[str, list[Resource]]) -> None:
    for name, resources in variants.items():
        config = config_of(resources)
        ports = container(resources)["ports"]
        assert ports == [
            {"name": "metrics", "containerPort": config.listen_port, "protocol": "TCP"}
        ]
        assert config.listen_host == "0.0.0.0", f"{name}: Prometheus scrapes the pod IP"
        pod = daemonset(resources)["spec"]["template"]["spec"]
        assert "hostPort" not in ports[0], f"{name}: the pod network is enough"
        assert not pod.get("hostNetwork"), f"{name}: the pod network is enough"


def test_the_default_port_needs_no_flag() -> None:
    # the manifests say 9445 in several places; it must be the exporter's own default
    assert Config().listen_port == 9445
    assert parse_config([], environ={}).listen_port == 9445


def test_probes_use_the_exporters_health_endpoints(base: list[Resource]) -> None:
    spec = container(base)
    assert spec["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert spec["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert spec["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    routes = {
        route.resource.canonical
        for route in make_web_app(object()).router.routes()  # type: ignore[arg-type]
        if route.resource is not None
    }
    assert {"/healthz", "/readyz", "/metrics"} <= routes


def host_path_volumes(resources: list[Resource]) -> dict[str, dict[str, Any]]:
    volumes = daemonset(resources)["spec"]["template"]["spec"].get("volumes", [])
    return {v["name"]: v for v in volumes if "hostPath" in v}


@pytest.mark.parametrize("volume", sorted(HOST_MOUNTS))
def test_each_host_mount_is_where_its_flag_points(
    variants: dict[str, list[Resource]], volume: str
) -> None:
    host_path, flag, attribute, relation, read_only = HOST_MOUNTS[volume]
    for name, resources in variants.items():
        volumes = host_path_volumes(resources)
        if volume not in volumes:
            continue
        assert flag in parser_options(), (
            f"{name}: volume {volume} is for {flag}, which gpu-exporter does not have (yet)"
        )
        assert volumes[volume]["hostPath"]["path"] == host_path
        mounts = [m for m in container(resources)["volumeMounts"] if m["name"] == volume]
        assert len(mounts) == 1, f"{name}: volume {volume} must be mounted once"
        mount = mounts[0]
        assert bool(mount.get("readOnly")) is read_only, f"{name}: {volume} readOnly"
        value = getattr(config_of(resources), attribute)
        if relation == "member":
            assert Path(mount["mountPath"]) in value, (
                f"{name}: {volume} is mounted at {mount['mountPath']}, not one of {flag} {value}"
            )
            continue
        where = Path(value).parent if relation == "parent" else Path(value)
        assert where == Path(mount["mountPath"]), (
            f"{name}: {volume} is mounted at {mount['mountPath']} but {flag} is {value}"
        )


def test_every_host_mount_belongs_to_a_flag(variants: dict[str, list[Resource]]) -> None:
    for name, resources in variants.items():
        unknown = set(host_path_volumes(resources)) - set(HOST_MOUNTS)
        assert not unknown, f"{name}: host mounts {unknown} are for no feature (HOST_MOUNTS)"
        spec = daemonset(resources)["spec"]["template"]["spec"]
        mounted = {m["name"] for m in container(resources).get("volumeMounts", [])}
        declared = {v["name"] for v in spec.get("volumes", [])}
        assert mounted == declared, f"{name}: volumes and mounts differ"


def test_path_settings_are_dropped_with_their_mount(variants: dict[str, list[Resource]]) -> None:
    """A feature's variable goes with its mount: no setting points at a path that is not there."""
    by_flag = {flag: volume for volume, (_, flag, *_rest) in HOST_MOUNTS.items()}
    known = env_options()
    for name, resources in variants.items():
        volumes = host_path_volumes(resources)
        for variable in exporter_env(container(resources)):
            volume = by_flag.get(known[variable])
            if volume is not None:
                assert volume in volumes, f"{name}: {variable} is set but {volume} is not mounted"


def test_the_kernel_log_is_read_exactly_when_it_can_be(
    variants: dict[str, list[Resource]],
) -> None:
    """The kernel log is read through syslog(2), which needs CAP_SYSLOG and no device: the
    source is on exactly where the capability is granted (or the pod is privileged)."""
    for name, resources in variants.items():
        security = container(resources)["securityContext"]
        granted = "SYSLOG" in security["capabilities"].get("add", []) or security["privileged"]
        config = config_of(resources)
        assert config.kmsg is granted, f"{name}: --kmsg without CAP_SYSLOG or back"
        assert "kmsg" not in host_path_volumes(resources), f"{name}: syslog(2) needs no device"
        if config.kmsg:
            assert config.kmsg_path == Path("/dev/kmsg"), f"{name}: only the default falls back"


def test_service_and_monitor_use_the_container_port(base: list[Resource]) -> None:
    port = container(base)["ports"][0]
    service = find(base, "Service", "gpu-exporter")
    assert service["spec"]["ports"] == [
        {
            "name": "metrics",
            "port": port["containerPort"],
            "targetPort": "metrics",
            "protocol": "TCP",
        }
    ]
    selector = daemonset(base)["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    monitor = find(base, "ServiceMonitor", "gpu-exporter")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert [e["path"] for e in monitor["spec"]["endpoints"]] == ["/metrics"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
