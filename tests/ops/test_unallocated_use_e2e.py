"""Use no allocation names (docs/allocation.md), end to end with the real binaries: the exporter
as a process on the built-in node, Prometheus running the kit's rules, Alertmanager with the
example routing, and a webhook receiver here.

The built-in node's GPU 7, which the scheduler thinks free, runs a pod that requested no GPU
(research/debug-shell) and a deleted pod's zombie holding 20 GiB; GPUs 0-3 are held exclusively
by a trainer and GPU 4 is time-sliced between two replicas. A job over SSH starts on the
notebook's GPU 5 and exits through simulator events at test time. The node has a stack of its
own: the fleet of test_e2e.py, whose answers are recorded (tests/ops/data/answers.json), stays
as it was.

The rules are rewritten by ``demo.stack.shorten_rules``, as for every other e2e case: each range
becomes 15 s and each ``for:`` at most 1 s (10 and 30 minutes cannot be waited in CI); the
expressions, labels and routes are the kit's own. That an alert waits its whole ``for:``, and that
memory freed sooner pages nobody, is checked at full length by promtool
(alerts/tests/unallocated_use_rules_test.yml); here each alert must still pass through pending
before it fires, so the shortened ``for:`` is on the path and not dropped.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import pytest
import pytest_asyncio
import yaml
from aiohttp import web
from demo.stack import (
    ALERTMANAGER_EXAMPLE,
    RULE_FILES,
    AlertmanagerProcess,
    ExporterProcess,
    PrometheusProcess,
    load_yaml,
    prometheus_config,
    shorten_rules,
    stop_all,
    wait_ready,
    webhook_alertmanager_config,
)

from tests.conftest import require_binary

from .helpers import alertmanager_binary
from .promquery import PrometheusQueries
from .webhook import Webhook

pytestmark = pytest.mark.asyncio(loop_scope="module")

WINDOW = "15s"
DEADLINE = 45.0  # seconds a condition may take: a process scan (5 s), scrapes, evaluations
GIB = 1 << 30

UNREQUESTED = ("research", "debug-shell", "7")  # namespace, pod, gpu
ZOMBIE_GPU = "7"
# The pods that hold their GPUs through the device plugin: exclusive, time-sliced, a notebook,
# MIG instances.
HOLDERS = {("ml-training", "llama-pretrain-0", gpu) for gpu in ("0", "1", "2", "3")} | {
    ("inference", "llm-serve-a", "4"),
    ("inference", "llm-serve-b", "4"),
    ("research", "jupyter-alice", "5"),
    ("batch", "finetune-small", "6"),
    ("batch", "embeddings-batch", "6"),
    ("research", "jupyter-bob", "6"),
}
SSH_JOB = {
    "gpu": 5,
    "host": True,
    "pid": 95001,
    "process_name": "ssh-bench",
    "memory": "2GiB",
    "sm": 0.5,
}


@dataclass
class Stack(PrometheusQueries):
    exporter: ExporterProcess
    prometheus: PrometheusProcess
    alertmanager: AlertmanagerProcess
    webhook: Webhook
    session: aiohttp.ClientSession

    deadline: ClassVar[float] = DEADLINE

    def diagnostics(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.output(15)}"
            for p in (self.exporter, self.prometheus, self.alertmanager)
        )

    async def ever(self, alert: str, state: str) -> list[dict[str, str]]:
        """The label sets ``alert`` has had in ``state`` since the stack started."""
        expr = f'max_over_time(ALERTS{{alertname="{alert}",alertstate="{state}"}}[1h])'
        return [r["metric"] for r in await self.query(expr)]

    def on_node(self, alert: str, **labels: str) -> Callable[[dict[str, str]], bool]:
        wanted = {"alertname": alert, "instance": self.exporter.address, **labels}
        return lambda got: all(got.get(k) == v for k, v in wanted.items())


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack() -> AsyncIterator[Stack]:
    prometheus_binary = require_binary("prometheus")
    am_binary = alertmanager_binary()
    workdir = Path(tempfile.mkdtemp(prefix="gx-unseen-"))  # short: unix socket paths are limited
    webhook = Webhook()
    app = web.Application()
    app.router.add_post("/{receiver}", webhook.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    webhook.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    exporter = ExporterProcess("builtin", None, workdir / "builtin")
    processes: list[Any] = [exporter]
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
    try:
        await asyncio.to_thread(exporter.wait_listening)
        rule_paths = []
        for source in RULE_FILES:
            rule_paths.append(workdir / source.name)
            short = shorten_rules(load_yaml(source), window=WINDOW)
            rule_paths[-1].write_text(yaml.safe_dump(short, sort_keys=False))
        am_config = webhook_alertmanager_config(load_yaml(ALERTMANAGER_EXAMPLE), webhook.url)
        alertmanager = AlertmanagerProcess(am_binary, am_config, workdir / "alertmanager")
        processes.append(alertmanager)
        prometheus = PrometheusProcess(
            prometheus_binary,
            prometheus_config([exporter.address], rule_paths, f"127.0.0.1:{alertmanager.port}"),
            workdir / "prometheus",
        )
        processes.append(prometheus)
        await asyncio.to_thread(wait_ready, f"{alertmanager.url}/-/ready", alertmanager)
        await asyncio.to_thread(wait_ready, f"{prometheus.url}/-/ready", prometheus)
        built = Stack(exporter, prometheus, alertmanager, webhook, session)
        await built.eventually('up{job="gpu-exporter"} == 1', bool, "the exporter scraped")
        yield built
    finally:
        await session.close()
        await asyncio.to_thread(stop_all, reversed(processes))
        await runner.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def pods_of(labels: list[dict[str, str]]) -> set[tuple[str, str, str]]:
    return {(m["namespace"], m["pod"], m["gpu"]) for m in labels}


def gpus_of(labels: list[dict[str, str]]) -> set[str]:
    return {m["gpu"] for m in labels}


# ---- tests --------------------------------------------------------------------------------------


async def test_a_pod_on_a_gpu_it_does_not_hold_reaches_its_team_and_infra(stack: Stack) -> None:
    namespace, pod, gpu = UNREQUESTED
    alert = stack.on_node("GPUUsedWithoutAllocation", namespace=namespace, pod=pod, gpu=gpu)
    team = await stack.webhook.wait_for_alert("team-research", alert, DEADLINE)
    assert team["annotations"]["runbook_url"].endswith("#gpuusedwithoutallocation")
    await stack.webhook.wait_for_alert("infra-tickets", alert, DEADLINE)
    assert pods_of(await stack.ever("GPUUsedWithoutAllocation", "pending")) == {UNREQUESTED}, (
        "the alert fired without waiting its for:"
    )


async def test_the_zombies_memory_pages_infra(stack: Stack) -> None:
    alert = stack.on_node("GPUMemoryHeldByGonePod", gpu=ZOMBIE_GPU)
    page = await stack.webhook.wait_for_alert("infra-pager", alert, DEADLINE)
    assert "20GiB of memory" in page["annotations"]["description"]
    assert page["annotations"]["runbook_url"].endswith("#gpumemoryheldbygonepod")
    assert gpus_of(await stack.ever("GPUMemoryHeldByGonePod", "pending")) == {ZOMBIE_GPU}
    gone = await stack.query('gpu_unattributed_memory_used_bytes{class="gone"}')
    assert [(m["metric"]["gpu"], float(m["value"][1])) for m in gone] == [(ZOMBIE_GPU, 20 * GIB)]


async def test_unrequested_use_is_charged_to_the_pods_namespace(stack: Stack) -> None:
    # debug-shell is GPU 7's only holder: one GPU-second per second, all of it unrequested.
    await stack.eventually(
        'namespace:gpu_unallocated_use_seconds:rate5m{namespace="research"}',
        lambda r: len(r) == 1 and abs(float(r[0]["value"][1]) - 1.0) <= 0.02,
        "research's unrequested GPU-seconds",
    )
    others = await stack.query(
        'namespace:gpu_unallocated_use_seconds:rate5m{namespace!="research"}'
    )
    assert {(r["metric"]["namespace"], float(r["value"][1])) for r in others} == {
        ("ml-training", 0.0),
        ("inference", 0.0),
        ("batch", 0.0),
    }, "the namespaces whose pods hold their GPUs run nothing unrequested"
    await stack.eventually(
        'namespace:gpu_unallocated_use_cost_per_hour:rate5m{namespace="research"} > 0',
        bool,
        "research's unrequested GPU cost",
    )


async def test_a_job_over_ssh_is_a_ticket_until_it_exits(stack: Stack) -> None:
    await asyncio.to_thread(stack.exporter.inject, {"type": "workload_start", **SSH_JOB})
    alert = stack.on_node("GPUProcessOutsideKubernetes", gpu="5")
    ticket = await stack.webhook.wait_for_alert("infra-tickets", alert, DEADLINE)
    assert ticket["annotations"]["runbook_url"].endswith("#gpuprocessoutsidekubernetes")
    assert gpus_of(await stack.ever("GPUProcessOutsideKubernetes", "pending")) == {"5"}
    assert gpus_of(await stack.ever("GPUProcessOutsideKubernetes", "firing")) == {"5"}, (
        "the zombie on GPU 7 is a gone pod's, not a process outside Kubernetes"
    )
    await asyncio.to_thread(stack.exporter.inject, {"type": "workload_stop", "pid": 95001})
    await stack.eventually(
        'ALERTS{alertname="GPUProcessOutsideKubernetes"}',
        lambda r: not r,
        "the ticket resolved once the job exited",
    )
    assert await stack.query('gpu_unattributed_memory_used_bytes{class="no_pod"}') == []


async def test_the_pods_that_hold_their_gpus_raise_none_of_it(stack: Stack) -> None:
    # Last: by now every alert above has fired, and the holders have had as long to.
    holders = await stack.eventually(
        'gpu_allocation_info{source="pod-resources"}',
        lambda r: pods_of([m["metric"] for m in r]) >= HOLDERS,
        "the device plugin's holders",
    )
    assert pods_of([m["metric"] for m in holders]) == HOLDERS
    seen = await stack.query('gpu_allocation_info{source="process"}')
    assert pods_of([m["metric"] for m in seen]) == {UNREQUESTED}, (
        "only the pod without a request is a holder by its processes"
    )
    for state in ("pending", "firing"):
        flagged = pods_of(await stack.ever("GPUUsedWithoutAllocation", state))
        assert flagged == {UNREQUESTED}, f"{state}: {flagged - {UNREQUESTED}} hold their GPUs"
    notified = {
        (a["labels"]["namespace"], a["labels"]["pod"], a["labels"]["gpu"])
        for receiver in ("team-ml", "team-inference", "team-research", "infra-tickets")
        for a in stack.webhook.alerts(receiver)
        if a["labels"]["alertname"] == "GPUUsedWithoutAllocation"
    }
    assert notified == {UNREQUESTED}
    zombie_gpus = gpus_of(await stack.ever("GPUMemoryHeldByGonePod", "firing"))
    assert zombie_gpus == {ZOMBIE_GPU}, "the holders' memory is nobody's zombie"
