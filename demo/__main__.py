"""``python -m demo`` (``make demo``): a simulated GPU fleet with the whole operations kit.

Starts four simulated nodes (the built-in 8x H100 node and demo/scenarios/node-*.yaml),
Prometheus scraping them with the kit's recording and alerting rules, Alertmanager with the
example routing (every receiver replaced by a local webhook that prints what it gets), prints the
URLs, and stops everything cleanly on Ctrl-C or SIGTERM.

Within minutes: an application Xid (built-in node, 90 s) goes to team-inference, a hardware Xid
(5 min) pages infra-pager with its drain recommendation, and the idle notebooks are reported to
team-research (the demo lowers the idle threshold from 2 h to 5 min).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from .stack import (
    ALERTMANAGER_EXAMPLE,
    DASHBOARDS,
    DEMO,
    RULE_FILES,
    AlertmanagerProcess,
    ExporterProcess,
    PrometheusProcess,
    find_binary,
    load_yaml,
    prometheus_config,
    shorten_rules,
    stop_all,
    wait_ready,
    webhook_alertmanager_config,
)


class _Printer(BaseHTTPRequestHandler):
    """Alertmanager webhook: one line per alert, prefixed by the receiver (the URL path)."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()
        receiver = self.path.strip("/")
        for alert in json.loads(body).get("alerts", []):
            labels = alert["labels"]
            keys = ("instance", "gpu", "xid", "class", "namespace", "pod", "reason")
            shown = " ".join(f"{k}={labels[k]}" for k in keys if labels.get(k))
            status = alert["status"].upper()
            print(f"  [{receiver}] {status} {labels.get('alertname')} {shown}", flush=True)

    def log_message(self, format: str, *args: Any) -> None:
        return


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus-port", type=int, default=9090)
    parser.add_argument("--alertmanager-port", type=int, default=9093)
    parser.add_argument("--idle-threshold", default="5m", help="GPUAllocatedIdle threshold")
    args = parser.parse_args(argv)

    prometheus_binary = find_binary("prometheus")
    alertmanager_binary = find_binary("alertmanager", "prometheus-alertmanager")
    if prometheus_binary is None or alertmanager_binary is None:
        print(
            "demo: needs prometheus and alertmanager on PATH "
            "(apt-get install prometheus prometheus-alertmanager, or make system-deps)",
            file=sys.stderr,
        )
        return 1

    workdir = Path(tempfile.mkdtemp(prefix="gpu-exporter-demo-"))
    webhook = ThreadingHTTPServer(("127.0.0.1", 0), _Printer)
    threading.Thread(target=webhook.serve_forever, name="webhook", daemon=True).start()
    webhook_url = f"http://127.0.0.1:{webhook.server_address[1]}"
    processes: list[Any] = []
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        nodes: dict[str, Path | None] = {"builtin": None}
        nodes.update({p.stem: p for p in sorted((DEMO / "scenarios").glob("*.yaml"))})
        exporters = []
        for name, scenario in nodes.items():
            exporter = ExporterProcess(name, scenario, workdir / name)
            processes.append(exporter)
            exporters.append(exporter)
        for exporter in exporters:
            exporter.wait_listening()

        threshold = (
            int(args.idle_threshold[:-1]) * {"s": 1, "m": 60, "h": 3600}[args.idle_threshold[-1]]
        )
        rule_paths = []
        for source in RULE_FILES:
            rules = load_yaml(source)
            if source.name == "alerting_rules.yml":
                # Real windows and for: durations; only the idle threshold is lowered.
                rules = shorten_rules(
                    rules, window="365d", longest_for="365d", idle_threshold_seconds=threshold
                )
            path = workdir / source.name
            path.write_text(yaml.safe_dump(rules, sort_keys=False))
            rule_paths.append(path)
        am_config = webhook_alertmanager_config(load_yaml(ALERTMANAGER_EXAMPLE), webhook_url)
        alertmanager = AlertmanagerProcess(
            alertmanager_binary, am_config, workdir / "alertmanager", port=args.alertmanager_port
        )
        processes.append(alertmanager)
        prometheus = PrometheusProcess(
            prometheus_binary,
            prometheus_config(
                [e.address for e in exporters],
                rule_paths,
                f"127.0.0.1:{alertmanager.port}",
                interval="5s",
            ),
            workdir / "prometheus",
            port=args.prometheus_port,
        )
        processes.append(prometheus)
        wait_ready(f"{alertmanager.url}/-/ready", alertmanager)
        wait_ready(f"{prometheus.url}/-/ready", prometheus)

        print("gpu-exporter demo is running (Ctrl-C stops it)\n")
        for exporter in exporters:
            print(
                f"  exporter {exporter.name:<10} http://{exporter.address}/metrics"
                f"  (status page: http://{exporter.address}/)"
            )
        print(f"  Prometheus          {prometheus.url}  (alerts: {prometheus.url}/alerts)")
        print(f"  Alertmanager        {alertmanager.url}")
        print(f"  Dashboards          import {DASHBOARDS}/*.json into Grafana, with a Prometheus")
        print(f"                      data source at {prometheus.url}")
        print("  Inject an event     curl -XPOST http://<exporter>/-/simulator/events \\")
        print('                        -d \'{"type": "xid", "gpu": 3, "code": 48}\'')
        print(f"  Idle threshold      {args.idle_threshold} (2h in alerts/alerting_rules.yml)\n")
        print("Notifications (receiver, status, alert):", flush=True)
        while not stop.wait(1.0):
            dead = [p for p in processes if not p.alive()]
            if dead:
                print(f"demo: {dead[0].name} exited:\n{dead[0].output()}", file=sys.stderr)
                return 1
        print("\nstopping...", flush=True)
        return 0
    finally:
        stop_all(reversed(processes))
        webhook.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
