"""Start simulated exporters, Prometheus and Alertmanager on loopback with the kit's files.

Everything runs as child processes on 127.0.0.1 with ephemeral ports, in one work directory:

- :class:`ExporterProcess`: ``python -m gpu_exporter --simulate SCENARIO`` with its own state
  directory and kernel-log file (the simulator plays its kubelet on a socket of its own: a
  ``--pod-resources-socket`` would replace it);
- :class:`PrometheusProcess`: scraping the exporters, loading the rule files (optionally
  rewritten by :func:`shorten_rules` so a test sees windows and ``for:`` of seconds);
- :class:`AlertmanagerProcess`: the routing of ``alerts/alertmanager.example.yml`` with every
  receiver pointed at a webhook (:func:`webhook_alertmanager_config`), clustering off.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "demo"
ALERTS = ROOT / "alerts"
RULE_FILES = (
    ALERTS / "recording_rules.yml",
    ALERTS / "price_rules.yml",
    ALERTS / "alerting_rules.yml",
)
ALERTMANAGER_EXAMPLE = ALERTS / "alertmanager.example.yml"
DASHBOARDS = ROOT / "dashboards"
IDLE_THRESHOLD_RULE = "fleet:gpu_allocation_idle_threshold:seconds"
STARTUP_LIMIT = 60.0

_RANGE = re.compile(r"\[(\d+)([smhd])\]")
_OFFSET = re.compile(r"\boffset\s+(\d+)([smhd])\b")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def find_binary(*names: str) -> str | None:
    """The first of ``names`` on PATH (Debian names Alertmanager prometheus-alertmanager)."""
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (for binaries that cannot report one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---- rule and routing files ---------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _duration_seconds(number: str, unit: str) -> int:
    return int(number) * _SECONDS[unit]


def shorten_rules(
    doc: Mapping[str, Any],
    *,
    window: str = "15s",
    longest_for: str = "1s",
    idle_threshold_seconds: float | None = None,
) -> dict[str, Any]:
    """A copy of a rule file with every range and offset set to ``window``, ``for:`` and
    ``keep_firing_for:`` capped at ``longest_for``, a group's own evaluation ``interval`` left
    to the global one and, when given, the idle-allocation threshold replaced.

    The rule names stay (``...:rate5m`` then means "over ``window``"): it is the same expressions
    on a time scale a test can wait for.
    """
    window_s = _duration_seconds(window[:-1], window[-1])
    cap_s = _duration_seconds(longest_for[:-1], longest_for[-1])

    def short_range(match: re.Match[str]) -> str:
        original = _duration_seconds(match.group(1), match.group(2))
        return f"[{min(original, window_s)}s]"

    def short_offset(match: re.Match[str]) -> str:
        original = _duration_seconds(match.group(1), match.group(2))
        return f"offset {min(original, window_s)}s"

    out = copy.deepcopy(dict(doc))
    for group in out["groups"]:
        group.pop("interval", None)
        for rule in group["rules"]:
            expr = _OFFSET.sub(short_offset, _RANGE.sub(short_range, str(rule["expr"])))
            if rule.get("record") == IDLE_THRESHOLD_RULE and idle_threshold_seconds is not None:
                expr = f"vector({idle_threshold_seconds:g})"
            rule["expr"] = expr
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    original = rule[key]
                    seconds = _duration_seconds(original[:-1], original[-1]) if original else 0
                    rule[key] = f"{min(seconds, cap_s)}s"
    return out


def webhook_alertmanager_config(
    example: Mapping[str, Any], webhook_base: str, *, fast: bool = True
) -> dict[str, Any]:
    """The example routing with every receiver replaced by a webhook to ``webhook_base/<name>``.

    With ``fast``, every group_wait / group_interval on the tree is 1 s (repeat 1 h): the same
    routes and inhibitions, delivered at test speed.
    """
    config = copy.deepcopy(dict(example))
    config["receivers"] = [
        {
            "name": receiver["name"],
            "webhook_configs": [
                {"url": f"{webhook_base}/{receiver['name']}", "send_resolved": True}
            ],
        }
        for receiver in example["receivers"]
    ]
    if fast:
        fast_routes(config)
    return config


def fast_routes(config: dict[str, Any]) -> None:
    """Set every group_wait / group_interval of ``config``'s route tree to 1 s (repeat 1 h)."""

    def speed_up(route: dict[str, Any]) -> None:
        for key in ("group_wait", "group_interval"):
            if key in route or route is config["route"]:
                route[key] = "1s"
        if "repeat_interval" in route or route is config["route"]:
            route["repeat_interval"] = "1h"
        for child in route.get("routes", []):
            speed_up(child)

    speed_up(config["route"])


def prometheus_config(
    targets: Sequence[str],
    rule_files: Sequence[Path],
    alertmanager: str | None,
    *,
    interval: str = "1s",
    evaluation_interval: str | None = None,
    extra_scrape_configs: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": evaluation_interval or interval,
        },
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {"job_name": "gpu-exporter", "static_configs": [{"targets": list(targets)}]},
            *extra_scrape_configs,
        ],
    }
    if alertmanager is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return config


# ---- processes ----------------------------------------------------------------------------------


class ChildProcess:
    """A child process whose output is kept (last lines) for diagnostics, stopped by SIGTERM."""

    name = "process"

    def __init__(self, command: Sequence[str], log_path: Path) -> None:
        self.command = list(command)
        self.log_path = log_path
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            self.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def output(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


class LoopbackServer(ChildProcess):
    """A child process serving HTTP on a loopback port it was given (``port``)."""

    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class ExporterProcess:
    """``gpu-exporter --simulate SCENARIO`` on an ephemeral loopback port."""

    def __init__(
        self, name: str, scenario: Path | None, workdir: Path, extra_args: Sequence[str] = ()
    ) -> None:
        self.name = name
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        simulate = ["--simulate", str(scenario)] if scenario is not None else ["--simulate"]
        self.command = [
            sys.executable,
            "-m",
            "gpu_exporter",
            "--log-format=json",
            "--listen=127.0.0.1:0",
            *simulate,
            "--fast-interval=200ms",
            "--slow-interval=1s",
            f"--state-dir={workdir / 'state'}",
            f"--kmsg-path={workdir / 'kmsg'}",
            *extra_args,
        ]
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: deque[str] = deque(maxlen=400)
        self._listening = threading.Event()
        self.port = 0
        self._reader = threading.Thread(target=self._read, name=f"{name}-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            if not self._listening.is_set():
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("event") == "listening":
                        self.port = int(str(event["address"]).rsplit(":", 1)[1])
                        self._listening.set()
        self._listening.set()  # exited: wake the waiter

    def wait_listening(self, timeout: float = STARTUP_LIMIT) -> int:
        self._listening.wait(timeout)
        if not self.port:
            raise RuntimeError(
                f"exporter {self.name} did not start (exit {self.process.poll()}):\n"
                + "\n".join(self.lines)
            )
        return self.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=10) as response:
            return str(response.read().decode())

    def inject(self, *events: Mapping[str, Any]) -> Any:
        """POST simulator events (timeline schema without ``at``) to the running exporter."""
        request = urllib.request.Request(
            f"http://{self.address}/-/simulator/events",
            data=json.dumps(list(events)).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read().decode())

    def output(self, lines: int = 40) -> str:
        return "\n".join(list(self.lines)[-lines:])

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=2)
        return self.process.returncode


class PrometheusProcess(LoopbackServer):
    name = "prometheus"

    def __init__(
        self, binary: str, config: Mapping[str, Any], workdir: Path, port: int | None = None
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        super().__init__(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            workdir / "prometheus.log",
        )


class AlertmanagerProcess(LoopbackServer):
    name = "alertmanager"

    def __init__(
        self, binary: str, config: Mapping[str, Any], workdir: Path, port: int | None = None
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        config_path = workdir / "alertmanager.yml"
        config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        super().__init__(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            workdir / "alertmanager.log",
        )


class VictoriaMetricsProcess(LoopbackServer):
    """VictoriaMetrics single-node: remote-write receiver and query API on one port.

    ``latency_offset`` is how long the newest samples stay hidden from queries (VictoriaMetrics'
    default is 30 s, for samples that arrive late; a test on a time scale of seconds lowers it).
    """

    name = "victoria-metrics"

    def __init__(
        self,
        binary: str,
        workdir: Path,
        *,
        port: int | None = None,
        latency_offset: str = "30s",
        extra_args: Sequence[str] = (),
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        super().__init__(
            [
                binary,
                f"-storageDataPath={workdir / 'data'}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                f"-search.latencyOffset={latency_offset}",
                "-retentionPeriod=1d",
                "-loggerLevel=WARN",
                *extra_args,
            ],
            workdir / "victoria-metrics.log",
        )


class VmagentProcess(LoopbackServer):
    """vmagent scraping a Prometheus-style scrape config and remote-writing to ``write_url``."""

    name = "vmagent"

    def __init__(
        self,
        binary: str,
        config: Mapping[str, Any],
        write_url: str,
        workdir: Path,
        *,
        port: int | None = None,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        config_path = workdir / "scrape.yml"
        config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        super().__init__(
            [
                binary,
                f"-promscrape.config={config_path}",
                f"-remoteWrite.url={write_url}",
                f"-remoteWrite.tmpDataPath={workdir / 'queue'}",
                "-remoteWrite.flushInterval=1s",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                "-loggerLevel=WARN",
            ],
            workdir / "vmagent.log",
        )


class VmalertProcess(LoopbackServer):
    """vmalert evaluating ``rule_files`` against VictoriaMetrics at ``store_url``, writing recorded
    series and alert state back to it and sending alerts to ``notifier_url``."""

    name = "vmalert"

    def __init__(
        self,
        binary: str,
        rule_files: Sequence[Path],
        store_url: str,
        notifier_url: str,
        workdir: Path,
        *,
        evaluation_interval: str = "1s",
        port: int | None = None,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        super().__init__(
            [
                binary,
                *(f"-rule={path}" for path in rule_files),
                f"-datasource.url={store_url}",
                f"-remoteWrite.url={store_url}",
                f"-remoteRead.url={store_url}",
                "-remoteWrite.flushInterval=1s",
                f"-notifier.url={notifier_url}",
                f"-evaluationInterval={evaluation_interval}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                "-loggerLevel=WARN",
            ],
            workdir / "vmalert.log",
        )


def without_keep_firing_for(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a rule file without ``keep_firing_for``, which vmalert before 1.92 (Debian ships
    1.79) rejects as an unknown field."""
    out = copy.deepcopy(dict(doc))
    for group in out["groups"]:
        for rule in group["rules"]:
            rule.pop("keep_firing_for", None)
    return out


def wait_ready(url: str, process: ChildProcess, timeout: float = STARTUP_LIMIT) -> None:
    """Poll ``url`` (a readiness endpoint) until 200, failing early if ``process`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"{process.name} exited:\n{process.output()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(
        f"{process.name} not ready at {url} after {timeout:.0f}s:\n{process.output()}"
    )


def query(prometheus_url: str, expr: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """An instant query; raises ValueError with Prometheus's error when it fails to parse/run."""
    url = f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = json.loads(response.read().decode())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read().decode() or "{}")
    if body.get("status") != "success":
        raise ValueError(f"{expr!r}: {body.get('errorType')}: {body.get('error')}")
    result = body["data"]["result"]
    return result if isinstance(result, list) else [{"metric": {}, "value": result}]


def stop_all(processes: Iterable[ExporterProcess | ChildProcess]) -> None:
    for process in processes:
        with contextlib.suppress(Exception):
            process.stop()
