"""What on-call actually receives: the routing example's own receivers (PagerDuty, Slack, webhook)
rendered by a real Alertmanager, with their URLs pointed at a capture server on loopback.

PagerDuty's Events API v2 refuses an event without a summary (and Alertmanager retries only
429/5xx), so a blank summary is a dropped page; a Slack message without a title is unreadable in
a channel. Every receiver must render a non-empty title/summary for any group, including a group
of different alerts (the Xid and the drain recommendation of one GPU arrive together), and one
job's Xid storm over many pods must reach its team as one message, not one per pod.
"""

from __future__ import annotations

import copy
import json
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from demo.stack import AlertmanagerProcess, fast_routes, load_yaml, wait_ready

from .helpers import ALERTMANAGER_CASES, ALERTMANAGER_EXAMPLE, alertmanager_binary, alerts

DEADLINE = 30.0  # seconds a notification may take (group_wait and group_interval are 1 s)
# The URL field of each receiver type the example uses; a new type needs its field here.
URL_FIELDS = {"pagerduty_configs": "url", "slack_configs": "api_url", "webhook_configs": "url"}
SUMMARIES = {alert["alert"]: alert["annotations"]["summary"] for alert in alerts()}


@dataclass
class Capture:
    """Every request Alertmanager sends, as (receiver, JSON body); the path names the receiver."""

    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)
    url: str = ""

    def add(self, receiver: str, body: dict[str, Any]) -> None:
        with self.changed:
            self.received.append((receiver, body))
            self.changed.notify_all()

    def bodies(self, receiver: str, match: Callable[[dict[str, Any]], bool]) -> list[Any]:
        with self.changed:
            return [body for name, body in self.received if name == receiver and match(body)]

    def wait_for(
        self,
        receiver: str,
        match: Callable[[dict[str, Any]], bool],
        done: Callable[[list[Any]], bool],
    ) -> list[dict[str, Any]]:
        """The matching bodies once ``done(bodies)`` holds; fails after DEADLINE."""
        with self.changed:
            ok = self.changed.wait_for(lambda: done(self.bodies(receiver, match)), DEADLINE)
            found = self.bodies(receiver, match)
        assert ok, f"{receiver}: after {DEADLINE:.0f}s only {json.dumps(found)[:2000]}"
        return found


def capture_handler(capture: Capture) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            capture.add(self.path.strip("/"), json.loads(self.rfile.read(length) or b"{}"))
            self.send_response(202)  # PagerDuty answers 202; Slack and webhooks take any 2xx
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def captured_config(example: dict[str, Any], base: str) -> dict[str, Any]:
    """The example as it is, but every receiver's URL pointed at ``base/<receiver>`` and the
    route tree at test speed (group_wait and group_interval 1 s)."""
    config = copy.deepcopy(example)
    for receiver in config["receivers"]:
        kinds = [key for key in receiver if key != "name"]
        for kind in kinds:
            assert kind in URL_FIELDS, f"{receiver['name']}: {kind} has no URL field here"
            for entry in receiver[kind]:
                entry[URL_FIELDS[kind]] = f"{base}/{receiver['name']}"
    fast_routes(config)
    return config


@pytest.fixture(scope="module")
def capture() -> Iterator[Capture]:
    found = Capture()
    server = ThreadingHTTPServer(("127.0.0.1", 0), capture_handler(found))
    thread = threading.Thread(target=server.serve_forever, name="capture", daemon=True)
    thread.start()
    found.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def alertmanager(
    capture: Capture, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AlertmanagerProcess]:
    binary = alertmanager_binary()
    workdir: Path = tmp_path_factory.mktemp("alertmanager-notify")
    config = captured_config(load_yaml(ALERTMANAGER_EXAMPLE), capture.url)
    process = AlertmanagerProcess(binary, config, workdir)
    try:
        wait_ready(f"{process.url}/-/ready", process)
        yield process
    finally:
        process.stop()


def post(url: str, *alerts: tuple[dict[str, str], dict[str, str]]) -> None:
    """POST (labels, annotations) pairs as firing alerts, as Prometheus does."""
    now = datetime.now(UTC)
    body = [
        {
            "labels": labels,
            "annotations": annotations,
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(minutes=10)).isoformat(),
        }
        for labels, annotations in alerts
    ]
    request = urllib.request.Request(
        f"{url}/api/v2/alerts",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def rule_alert(name: str, **labels: str) -> tuple[dict[str, str], dict[str, str]]:
    """An alert as the kit's rule ``name`` sends it (its summary; a description naming labels)."""
    annotations = {
        "summary": SUMMARIES[name],
        "description": f"{name} on {labels.get('instance')} GPU {labels.get('gpu')}",
    }
    return {"alertname": name, **labels}, annotations


def pd_for(instance: str) -> Callable[[dict[str, Any]], bool]:
    return lambda body: instance in json.dumps(body.get("payload", {}).get("custom_details", {}))


def rendered_titles(kind: str, body: dict[str, Any]) -> dict[str, str]:
    """The fields a person reads first, as the receiver type carries them."""
    if kind == "pagerduty_configs":
        return {"payload.summary": str(body["payload"].get("summary", ""))}
    if kind == "slack_configs":
        attachment = body["attachments"][0]
        return {"title": str(attachment.get("title", "")), "text": str(attachment.get("text", ""))}
    return {}


def test_a_hardware_xid_and_a_lost_gpu_page_with_non_empty_summaries(
    alertmanager: AlertmanagerProcess, capture: Capture
) -> None:
    # GPU 1: the Xid and the drain recommendation, one group with two different summaries.
    # GPU 2 of the same node: lost, its own group.
    node = {"instance": "pd-node:9445", "job": "gpu-exporter", "class": "hardware"}
    critical = {**node, "severity": "critical"}
    post(
        alertmanager.url,
        rule_alert("GPUXidHardwareError", **critical, gpu="1", uuid="GPU-a", xid="48"),
        rule_alert("GPUDrainRecommended", **critical, gpu="1", uuid="GPU-a", reason="hardware_xid"),
        rule_alert("GPULost", **critical, gpu="2", uuid="GPU-b"),
    )
    events = capture.wait_for(
        "infra-pager",
        pd_for("pd-node:9445"),
        lambda found: len({event["dedup_key"] for event in found}) >= 2,
    )
    for event in events:
        assert event["event_action"] == "trigger"
        summary = event["payload"]["summary"].strip()
        assert summary, f"PagerDuty would refuse this event (empty summary): {json.dumps(event)}"
    mixed = [e for e in events if "GPUDrainRecommended" in json.dumps(e["payload"])]
    assert mixed, "the Xid and the drain recommendation of GPU 1 did not page"
    for name in ("GPUXidHardwareError", "GPUDrainRecommended"):
        assert SUMMARIES[name] in mixed[0]["payload"]["summary"], mixed[0]["payload"]["summary"]
    assert all("pd-node:9445" in e["payload"]["summary"] for e in events), [
        e["payload"]["summary"] for e in events
    ]


def receivers_with_templates() -> list[tuple[str, str, dict[str, str]]]:
    """(receiver, type, labels that route to it) for every receiver that renders a title."""
    cases = load_yaml(ALERTMANAGER_CASES)["routes"]
    out = []
    for receiver in load_yaml(ALERTMANAGER_EXAMPLE)["receivers"]:
        for kind in receiver:
            if kind in ("pagerduty_configs", "slack_configs"):
                labels = next(c["labels"] for c in cases if c["receivers"] == [receiver["name"]])
                out.append((receiver["name"], kind, dict(labels)))
    return out


@pytest.mark.parametrize(
    ("receiver", "kind", "labels"), receivers_with_templates(), ids=lambda v: str(v)[:24]
)
def test_every_receiver_renders_a_title_for_a_group_of_different_alerts(
    alertmanager: AlertmanagerProcess,
    capture: Capture,
    receiver: str,
    kind: str,
    labels: dict[str, str],
) -> None:
    instance = f"mixed-{receiver}:9445"
    base = {**labels, "instance": instance, "pod": "p-1"}
    other = {**base, "pod": "p-2", "xid": "31"} if "xid" in base else {**base, "pod": "p-2"}
    post(
        alertmanager.url,
        (base, {"summary": "First summary.", "description": f"first on {instance}"}),
        (other, {"summary": "Another summary.", "description": f"second on {instance}"}),
    )
    bodies = capture.wait_for(
        receiver,
        lambda body: instance in json.dumps(body),
        lambda found: sum(json.dumps(b).count(" on " + instance) for b in found) >= 2,
    )
    for body in bodies:
        for name, value in rendered_titles(kind, body).items():
            assert value.strip(), f"{receiver}: empty {name} in {json.dumps(body)}"


def test_a_sixteen_pod_storm_of_one_job_reaches_its_team_in_at_most_two_messages(
    alertmanager: AlertmanagerProcess, capture: Capture
) -> None:
    pods = [f"train-worker-{n}" for n in range(16)]
    post(
        alertmanager.url,
        *(
            (
                {
                    "alertname": "GPUXidApplicationError",
                    "class": "application",
                    "severity": "warning",
                    "instance": f"storm-{n % 2}:9445",  # a job spread over two nodes
                    "job": "gpu-exporter",
                    "gpu": str(n % 8),
                    "xid": "13",
                    "namespace": "ml-storm",
                    "pod": pod,
                },
                {"summary": SUMMARIES["GPUXidApplicationError"], "description": f"{pod} hit 13"},
            )
            for n, pod in enumerate(pods)
        ),
    )

    def every_pod_listed(found: list[dict[str, Any]]) -> bool:
        text = json.dumps(found)
        return all(f"{pod} hit 13" in text for pod in pods)

    messages = capture.wait_for("team-ml", lambda b: "ml-storm" in json.dumps(b), every_pod_listed)
    assert len(messages) <= 2, (
        f"{len(messages)} Slack messages for one job's storm (one per pod: is pod in group_by?)"
    )
