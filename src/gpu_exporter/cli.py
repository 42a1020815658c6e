"""Command line: flags (each also read from ``GPU_EXPORTER_<FLAG>``) into one frozen Config.

The only module that exits the process. Every user error is one line on stderr naming what and
where, with a non-zero status; never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from . import __version__
from .collectors import ALL_COLLECTORS
from .config import DEFAULT_LISTEN, Config, SimulatorConfig
from .logs import LEVELS, configure_logging

ENV_PREFIX = "GPU_EXPORTER_"
EXIT_USAGE = 2
EXIT_FAILURE = 1
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
BUILTIN_SCENARIO = "builtin"


class UsageError(Exception):
    """A bad flag, environment variable or file: reported as one line, exit status 2."""


def parse_duration(text: str) -> float:
    """``1s``, ``500ms``, ``2m``, ``7d``, ``1.5`` (seconds) -> seconds; must be positive."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"invalid duration {text!r} (use e.g. 500ms, 1s, 2m)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid listen address {text!r} (use HOST:PORT, e.g. 0.0.0.0:9445)")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_count(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"invalid count {text!r} (must be a whole number of at least 1)")
    return int(text)


def parse_ratio(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"invalid ratio {text!r} (must be between 0 and 1)")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap a parser so argparse reports its ValueError message instead of a generic one."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    convert.__name__ = parse.__name__
    return convert


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpu-exporter",
        description="Prometheus exporter for NVIDIA GPUs. Every flag also reads "
        "GPU_EXPORTER_<FLAG> (e.g. GPU_EXPORTER_LISTEN, GPU_EXPORTER_COLLECTOR_ECC=false).",
    )
    add = parser.add_argument
    add("--version", action="version", version=f"gpu-exporter {__version__}")
    add(
        "--listen",
        type=_checked(parse_listen),
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve metrics on (default {DEFAULT_LISTEN})",
    )
    add(
        "--simulate",
        nargs="?",
        const=BUILTIN_SCENARIO,
        default=None,
        metavar="SCENARIO.yaml",
        help="run on the simulator instead of NVML; without a file, the built-in 8x H100 node",
    )
    add(
        "--fast-interval",
        type=_checked(parse_duration),
        default=1.0,
        metavar="DURATION",
        help="sampling interval of fast signals: activity, power, clocks... (default 1s)",
    )
    add(
        "--slow-interval",
        type=_checked(parse_duration),
        default=30.0,
        metavar="DURATION",
        help="sampling interval of slow signals: ECC, row remapping, inventory (default 30s)",
    )
    add(
        "--nvml-timeout",
        type=_checked(parse_duration),
        default=1.0,
        metavar="DURATION",
        help="give up on a collector's NVML calls for a device after this long (default 1s)",
    )
    add(
        "--kmsg-path",
        type=Path,
        default=Path("/dev/kmsg"),
        metavar="PATH",
        help="kernel log to read Xids from (default /dev/kmsg)",
    )
    add(
        "--kmsg",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read Xids from the kernel log (needs CAP_SYSLOG; default on)",
    )
    add(
        "--nvml-events",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="receive Xids as NVML events (default on)",
    )
    add(
        "--xid-classes",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML file overriding Xid classes, e.g. '94: hardware' (see docs/xid.md)",
    )
    add(
        "--xid-pod-retention",
        type=_checked(parse_duration),
        default=7 * 86400.0,
        metavar="DURATION",
        help="withdraw a pod's gpu_xid_errors_total series this long after its latest Xid; the "
        "per-class totals keep its count (default 7d)",
    )
    add(
        "--pod-resources-socket",
        type=Path,
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        metavar="PATH",
        help="kubelet pod-resources socket (default /var/lib/kubelet/pod-resources/kubelet.sock)",
    )
    add(
        "--allocation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="attribute GPUs to pods through the kubelet pod-resources API (default on)",
    )
    add(
        "--pod-resources-interval",
        type=_checked(parse_duration),
        default=1.0,
        metavar="DURATION",
        help="how often to ask the kubelet who holds which GPU (default 1s)",
    )
    add(
        "--container-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="per-container GPU memory from NVML processes, host /proc and pod logs (default on)",
    )
    add(
        "--pod-logs-path",
        type=Path,
        default=Path("/var/log/pods"),
        metavar="PATH",
        help="the host's pod log directory, read for names only (default /var/log/pods)",
    )
    add(
        "--state-dir",
        type=Path,
        default=Path("/var/lib/gpu-exporter"),
        metavar="DIR",
        help="where the Xid journal is kept (default /var/lib/gpu-exporter)",
    )
    add(
        "--proc-path",
        type=Path,
        default=Path("/proc"),
        metavar="PATH",
        help="the host's /proc, for process-to-pod mapping (default /proc)",
    )
    add(
        "--idle-threshold",
        type=_checked(parse_ratio),
        default=0.05,
        metavar="RATIO",
        help="SM activity below which an allocated GPU counts as idle (default 0.05)",
    )
    add(
        "--web.config.file",
        dest="web_config_file",
        type=Path,
        default=None,
        metavar="FILE",
        help="exporter-toolkit web config (TLS, basic auth), as node_exporter's; see "
        "docs/security.md (default: none, plain HTTP without authentication)",
    )
    add(
        "--web.auth-health",
        dest="web_auth_health",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="require the web config's credentials on /healthz and /readyz too (default off: "
        "kubelet probes send none)",
    )
    add(
        "--web.enable-admin-api",
        dest="web_enable_admin_api",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="serve POST /-/drain/clear, which clears a GPU's drain recommendation (default off; "
        "protect it with the web config's credentials, see docs/security.md)",
    )
    add(
        "--web.max-requests",
        dest="web_max_requests",
        type=_checked(parse_count),
        default=40,
        metavar="N",
        help="requests served at once; more are answered 503 at once (default 40)",
    )
    add(
        "--web.read-timeout",
        dest="web_read_timeout",
        type=_checked(parse_duration),
        default=30.0,
        metavar="DURATION",
        help="a connection must send a complete request head within this long of opening or of "
        "its previous response, else it is closed; also the keep-alive idle time (default 30s)",
    )
    add(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="log format; auto = console on a terminal, JSON otherwise",
    )
    add("--log-level", choices=LEVELS, default="info")
    for collector in ALL_COLLECTORS:
        state = "enabled" if collector.enabled_by_default else "disabled"
        add(
            f"--collector.{collector.name}",
            dest=f"collector_{collector.name}",
            action=argparse.BooleanOptionalAction,
            default=collector.enabled_by_default,
            help=f"{collector.help} ({state} by default)",
        )
    return parser


def env_name(option: str) -> str:
    return ENV_PREFIX + option.lstrip("-").replace("-", "_").replace(".", "_").upper()


def _env_args(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> list[str]:
    """Turn GPU_EXPORTER_* variables into flags placed before the real ones (which win)."""
    args: list[str] = []
    for action in parser._actions:
        long_options = [o for o in action.option_strings if o.startswith("--")]
        if not long_options or action.dest in ("help", "version"):
            continue
        option = long_options[0]
        name = env_name(option)
        if name not in environ:
            continue
        value = environ[name]
        if isinstance(action, argparse.BooleanOptionalAction):
            args.append(option if _env_bool(name, value) else option.replace("--", "--no-", 1))
        elif action.dest == "simulate":
            if value.strip().lower() in _TRUE:
                args.append(option)
            elif value.strip().lower() not in _FALSE:
                args.append(f"{option}={value}")
        else:
            args.append(f"{option}={value}")
    return args


def _env_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise UsageError(f"environment variable {name}: invalid boolean {value!r} (use true or false)")


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Config:
    parser = build_parser()
    environ = os.environ if environ is None else environ
    namespace = parser.parse_args([*_env_args(parser, environ), *argv])
    host, port = namespace.listen
    simulator = None
    if namespace.simulate is not None:
        scenario = None if namespace.simulate == BUILTIN_SCENARIO else Path(namespace.simulate)
        simulator = SimulatorConfig(scenario)
    collectors = frozenset(
        c.name for c in ALL_COLLECTORS if getattr(namespace, f"collector_{c.name}")
    )
    return Config(
        listen_host=host,
        listen_port=port,
        simulator=simulator,
        fast_interval=namespace.fast_interval,
        slow_interval=namespace.slow_interval,
        nvml_timeout=namespace.nvml_timeout,
        collectors=collectors,
        kmsg_path=namespace.kmsg_path,
        pod_resources_socket=namespace.pod_resources_socket,
        state_dir=namespace.state_dir,
        proc_path=namespace.proc_path,
        xid_classes=namespace.xid_classes,
        xid_pod_retention=namespace.xid_pod_retention,
        kmsg=namespace.kmsg,
        nvml_events=namespace.nvml_events,
        allocation=namespace.allocation,
        container_memory=namespace.container_memory,
        pod_logs_path=namespace.pod_logs_path,
        pod_resources_interval=namespace.pod_resources_interval,
        idle_threshold=namespace.idle_threshold,
        web_config_file=namespace.web_config_file,
        web_auth_health=namespace.web_auth_health,
        web_enable_admin_api=namespace.web_enable_admin_api,
        web_max_requests=namespace.web_max_requests,
        web_read_timeout=namespace.web_read_timeout,
        log_format=namespace.log_format,
        log_level=namespace.log_level,
    )


def load_files(config: Config) -> Config:
    """Read the files the flags name, once, at start: a bad file is a usage error (exit 2)."""
    if config.xid_classes is not None:
        _check_xid_classes(config.xid_classes)
    if config.web_config_file is None:
        return config
    from .webconfig import WebConfigError, load_web_config

    try:
        return replace(config, web=load_web_config(config.web_config_file))
    except WebConfigError as exc:
        raise UsageError(str(exc)) from exc


def _check_xid_classes(path: Path) -> None:
    """Validate the override file up front, so a mistake is one line and exit status 2."""
    from .xid import XidClassesError, load_classifier

    try:
        load_classifier(path)
    except XidClassesError as exc:
        raise UsageError(str(exc)) from exc


def run(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    from .app import build_exporter, run_until_signalled
    from .nvml import NvmlUnavailable

    try:
        config = load_files(parse_config(sys.argv[1:] if argv is None else argv, environ))
    except UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    configure_logging(config.log_format, config.log_level)
    # Worker threads run Python (pynvml's wrappers, the collectors) between NVML calls; at the
    # default 5 ms switch interval the event loop can wait that long for the GIL on every scrape
    # that lands during a sampling round (bench/: p99 at 8 scrapers fell 1.5-4x with 0.5 ms).
    sys.setswitchinterval(0.0005)
    try:
        exporter = build_exporter(config)
        asyncio.run(run_until_signalled(exporter))
    except NvmlUnavailable as exc:
        return _fail(
            f"NVML is not available ({exc}); on a machine without an NVIDIA GPU and driver, "
            "run with --simulate to use the built-in simulated node",
            EXIT_FAILURE,
        )
    except OSError as exc:
        return _fail(
            f"cannot listen on {config.listen_host}:{config.listen_port}: {exc.strerror or exc}",
            EXIT_FAILURE,
        )
    except Exception as exc:
        if type(exc).__name__ == "ScenarioError":
            return _fail(str(exc), EXIT_USAGE)
        raise
    return 0


def _fail(message: str, status: int) -> int:
    print(f"gpu-exporter: error: {message}", file=sys.stderr)
    return status


def main() -> NoReturn:
    sys.exit(run())
