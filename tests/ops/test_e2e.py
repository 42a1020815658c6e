"""End to end with the real binaries: three simulated nodes, Prometheus running the kit's rules
(windows and ``for:`` shortened to seconds), Alertmanager with the example routing, and a webhook
receiver here. Injected Xids must reach the right receivers, the idle notebook must be reported
to its team, every dashboard query must return data and the fleet recording rules must agree with
the scenarios' ground truth within 2%.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import tempfile
import time
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

from gpu_exporter.cli import build_parser
from tests.conftest import require_binary

from . import answers
from .helpers import (
    ALERTMANAGER_EXAMPLE,
    COMPAT_RULES,
    alertmanager_binary,
    dashboard_queries,
    dashboards,
    panels,
    substitute,
)
from .incidents import (
    FATAL_SXID,
    KSM_PATH,
    SCENARIOS,
    inject_incidents,
    ksm_scrape_config,
    kube_state_metrics,
)
from .promquery import PrometheusQueries
from .webhook import Webhook

pytestmark = pytest.mark.asyncio(loop_scope="module")

WINDOW = "15s"  # every [5m]/[1h]/offset in the rules becomes this
DEADLINE = 45.0  # seconds any one condition may take to come true
TOLERANCE = 0.02  # relative, for the ground-truth comparisons

# ---- ground truth of the simulated fleet (incidents.SCENARIOS) ---------------------------------
# Capacity in whole GPUs: A 4, B 1 + (3+2+1+1)/7, C 2 = 8; allocated: A 4, B 1 + 5/7, C 2.
TRUE_ALLOCATED = (4 + 1 + 5 / 7 + 2) / 8
# SM activity over the capacity that reports it (A 4, B 2; C has no GPM):
TRUE_SM_ACTIVE = (0.8 + 0.8 + 0.0 + 0.1 + 0.5 + 0.6 * 3 / 7 + 0.3 * 2 / 7) / 6

# The kit's rules and the optional dcgm-exporter compatibility rules (docs/migration.md).
E2E_RULE_FILES = (*RULE_FILES, COMPAT_RULES)
DCGM_DASHBOARD = Path(__file__).parent / "data" / "dcgm_exporter_dashboard.yml"

XID_METRICS = ("gpu_xid", "gpu_drain_recommended", "class:gpu_xid")
# The simulated fleet has no Slurm node: the cost dashboard's Slurm row has no data here (its
# rules are checked with data by alerts/tests/slurm_rules_test.yml).
SLURM_METRICS = ("gpu_slurm_",)
# Families served only with a detail flag (docs/migration.md): a panel query of them alone is
# empty at defaults.
DETAIL_FAMILIES = ("gpu_pcie_errors_total",)
ALLOCATION_METRICS = (
    "gpu_alloc",
    "gpu_container_",
    "gpu_sharing_info",
    "namespace:",
    "fleet:gpu_allocated",
    "fleet:gpu_allocation_activity_gap",
    "fleet:gpu_reclaimable",
    "device:gpu_allocat",
)


# ---- the stack ----------------------------------------------------------------------------------


@dataclass
class Stack(PrometheusQueries):
    exporters: dict[str, ExporterProcess]
    prometheus: PrometheusProcess
    alertmanager: AlertmanagerProcess
    webhook: Webhook
    session: aiohttp.ClientSession
    xid_wired: bool
    allocation_wired: bool

    deadline: ClassVar[float] = DEADLINE

    def diagnostics(self) -> str:
        parts = [f"--- {p.name}\n{p.output(15)}" for p in (self.prometheus, self.alertmanager)]
        parts += [f"--- exporter {n}\n{e.output(10)}" for n, e in self.exporters.items()]
        return "\n".join(parts)


def _xid_in_parser() -> bool:
    return any("--xid-classes" in a.option_strings for a in build_parser()._actions)


def _allocation_wired(exporter: ExporterProcess, seconds: float = 15.0) -> bool:
    """The app wires the allocation subsystem, and it serves its source's self-metric."""
    import gpu_exporter.app

    if "allocation" not in inspect.getsource(gpu_exporter.app):
        return False
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if 'source="pod_resources"' in exporter.metrics():
            return True
        time.sleep(0.2)
    return False


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack() -> AsyncIterator[Stack]:
    prometheus_binary = require_binary("prometheus")
    am_binary = alertmanager_binary()
    workdir = Path(tempfile.mkdtemp(prefix="gx-e2e-"))  # short: unix socket paths are limited
    webhook = Webhook()
    app = web.Application()
    app.router.add_post("/{receiver}", webhook.handle)
    app.router.add_get(KSM_PATH, kube_state_metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    webhook.url = f"http://127.0.0.1:{port}"

    exporters: dict[str, ExporterProcess] = {}
    processes: list[Any] = []
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
    try:
        for name, scenario in SCENARIOS.items():
            exporters[name] = ExporterProcess(name, scenario, workdir / name)
            processes.append(exporters[name])
        for exporter in exporters.values():
            await asyncio.to_thread(exporter.wait_listening)
        metrics = await asyncio.to_thread(exporters["node-a"].metrics)
        xid_wired = _xid_in_parser() and "gpu_drain_recommended" in metrics
        allocation_wired = await asyncio.to_thread(_allocation_wired, exporters["node-a"])

        rule_paths = []
        for source in E2E_RULE_FILES:
            short = shorten_rules(load_yaml(source), window=WINDOW, idle_threshold_seconds=3)
            rule_paths.append(workdir / source.name)
            rule_paths[-1].write_text(yaml.safe_dump(short, sort_keys=False))
        am_config = webhook_alertmanager_config(load_yaml(ALERTMANAGER_EXAMPLE), webhook.url)
        alertmanager = AlertmanagerProcess(am_binary, am_config, workdir / "alertmanager")
        processes.append(alertmanager)
        targets = [e.address for e in exporters.values()]
        prometheus = PrometheusProcess(
            prometheus_binary,
            prometheus_config(
                targets,
                rule_paths,
                f"127.0.0.1:{alertmanager.port}",
                extra_scrape_configs=[ksm_scrape_config(port)],
            ),
            workdir / "prometheus",
        )
        processes.append(prometheus)
        await asyncio.to_thread(wait_ready, f"{alertmanager.url}/-/ready", alertmanager)
        await asyncio.to_thread(wait_ready, f"{prometheus.url}/-/ready", prometheus)
        built = Stack(
            exporters, prometheus, alertmanager, webhook, session, xid_wired, allocation_wired
        )
        await built.eventually(
            'count(up{job="gpu-exporter"} == 1)',
            lambda r: bool(r) and float(r[0]["value"][1]) == len(exporters),
            "all exporters scraped",
        )
        await inject_incidents(exporters)
        yield built
    finally:
        await session.close()
        await asyncio.to_thread(stop_all, reversed(processes))
        await runner.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def require_xid(stack: Stack) -> None:
    assert stack.xid_wired, "the simulated nodes serve no Xid series: the Xid wiring is broken"


def require_allocation(stack: Stack) -> None:
    assert stack.allocation_wired, (
        "the simulated nodes serve no gpu_allocated series: the allocation wiring is broken"
    )


def close_to(truth: float) -> Callable[[list[dict[str, Any]]], bool]:
    def ok(result: list[dict[str, Any]]) -> bool:
        return len(result) == 1 and abs(float(result[0]["value"][1]) - truth) <= TOLERANCE * truth

    return ok


# ---- tests --------------------------------------------------------------------------------------


async def test_every_rule_loads_and_evaluates_without_error(stack: Stack) -> None:
    deadline = time.monotonic() + DEADLINE
    while True:
        async with stack.session.get(f"{stack.prometheus.url}/api/v1/rules") as response:
            groups = (await response.json())["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        if all(rule.get("lastEvaluation", "").startswith("20") for rule in rules):
            break
        assert time.monotonic() < deadline, "rules never evaluated"
        await asyncio.sleep(0.5)
    expected = sum(len(g["rules"]) for path in E2E_RULE_FILES for g in load_yaml(path)["groups"])
    assert len(rules) == expected
    broken = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not broken, broken


async def test_fleet_sm_activity_agrees_with_the_scenarios(stack: Stack) -> None:
    await stack.eventually(
        "fleet:gpu_sm_active:ratio_rate5m", close_to(TRUE_SM_ACTIVE), "fleet SM activity"
    )
    await stack.eventually("fleet:gpu_capacity:sum", close_to(8.0), "fleet capacity")


async def test_fleet_allocation_agrees_with_the_scenarios(stack: Stack) -> None:
    require_allocation(stack)
    await stack.eventually(
        "fleet:gpu_allocated:ratio_rate5m", close_to(TRUE_ALLOCATED), "fleet allocation"
    )
    await stack.eventually(
        "fleet:gpu_allocation_activity_gap:ratio_rate5m",
        close_to(TRUE_ALLOCATED - TRUE_SM_ACTIVE),
        "fleet allocation/activity gap",
    )
    # The notebook is the only idle allocation: one whole GPU.
    await stack.eventually(
        'namespace:gpu_allocated_idle_seconds:rate5m{namespace="research"}',
        close_to(1.0),
        "idle GPUs held by research",
    )


async def test_a_hardware_xid_pages_infra_with_its_gpu_and_class(stack: Stack) -> None:
    require_xid(stack)
    node_a = stack.exporters["node-a"].address
    alert = await stack.webhook.wait_for_alert(
        "infra-pager",
        lambda labels: (
            labels.get("alertname") == "GPUXidHardwareError" and labels.get("instance") == node_a
        ),
    )
    assert alert["labels"]["gpu"] == "1"
    assert alert["labels"]["class"] == "hardware"
    assert alert["labels"]["xid"] == "48"
    assert alert["annotations"]["runbook_url"].endswith("#gpuxidhardwareerror")


async def test_a_fatal_nvswitch_sxid_pages_infra_with_its_switch(stack: Stack) -> None:
    require_xid(stack)
    node_a = stack.exporters["node-a"].address
    # The fixture's SXid was the first of its series; a second one is an increase as well.
    await asyncio.to_thread(stack.exporters["node-a"].inject, FATAL_SXID)
    alert = await stack.webhook.wait_for_alert(
        "infra-pager",
        lambda labels: (
            labels.get("alertname") == "GPUNVSwitchFatalError" and labels.get("instance") == node_a
        ),
    )
    assert alert["labels"]["switch"] == "3"
    assert alert["labels"]["pci_bus_id"] == "0000:08:00.0"
    assert alert["labels"]["sxid"] == "20034"
    assert alert["labels"]["class"] == "hardware"
    assert "gpu" not in alert["labels"]
    assert alert["annotations"]["runbook_url"].endswith("#gpunvswitchfatalerror")


async def test_an_application_xid_reaches_the_team_owning_the_namespace(stack: Stack) -> None:
    require_xid(stack)
    require_allocation(stack)  # the namespace comes from who held the GPU
    alert = await stack.webhook.wait_for_alert(
        "team-inference",
        lambda labels: labels.get("alertname") == "GPUXidApplicationError",
    )
    assert alert["labels"]["namespace"] == "inference"
    assert alert["labels"]["pod"] == "llm-serve-a"
    assert alert["labels"]["class"] == "application"
    assert alert["labels"]["xid"] == "13"
    assert not stack.webhook.alerts("infra-pager") or all(
        a["labels"].get("alertname") != "GPUXidApplicationError"
        for a in stack.webhook.alerts("infra-pager")
    )


async def test_the_idle_notebook_is_reported_to_its_team(stack: Stack) -> None:
    require_allocation(stack)
    alert = await stack.webhook.wait_for_alert(
        "team-research",
        lambda labels: labels.get("alertname") == "GPUAllocatedIdle",
    )
    assert alert["labels"]["pod"] == "jupyter-alice"
    assert alert["labels"]["gpu"] == "2"


async def test_every_dashboard_query_parses_and_returns_data(stack: Stack) -> None:
    every = dashboard_queries()
    queries = [q for q in every if not any(m in q[2] for m in SLURM_METRICS)]
    for _, _, expr in every:
        await stack.query(expr)  # the Slurm row's queries still parse and evaluate
    waiting: list[tuple[str, str, str]] = []
    deferred: list[str] = []
    deadline = time.monotonic() + DEADLINE
    pending = list(queries)
    while pending:
        waiting = []
        for dashboard, title, expr in pending:
            result = await stack.query(expr)  # raises on a parse or evaluation error
            if not result:
                waiting.append((dashboard, title, expr))
        # Queries of a subsystem not wired yet cannot return data: report them, do not wait.
        deferred = [
            f"{d}: {t}"
            for d, t, e in waiting
            if (not stack.xid_wired and any(m in e for m in XID_METRICS))
            or (not stack.allocation_wired and any(m in e for m in ALLOCATION_METRICS))
        ]
        pending = [
            w
            for w in waiting
            if f"{w[0]}: {w[1]}" not in deferred and not any(m in w[2] for m in DETAIL_FAMILIES)
        ]
        if not pending or time.monotonic() > deadline:
            break
        await asyncio.sleep(1.0)
    assert not pending, "queries without data:\n" + "\n".join(
        f"{d}: {t}: {e}" for d, t, e in pending
    )
    assert not deferred, "queries of unwired subsystems: " + "; ".join(deferred)


async def test_dcgm_exporters_own_dashboard_works_through_the_compat_rules(stack: Stack) -> None:
    """Every query of NVIDIA's dcgm-exporter dashboard, unchanged, answers from gpu-exporter."""
    queries = load_yaml(DCGM_DASHBOARD)["queries"]
    for query in queries:
        await stack.eventually(
            substitute(query["expr"]), bool, f"dcgm-exporter dashboard panel {query['panel']!r}"
        )


async def test_idle_cost_and_queues_are_recorded_for_the_simulated_fleet(stack: Stack) -> None:
    require_allocation(stack)
    await stack.eventually(
        "fleet:gpu_allocated_idle_cost_per_hour:rate5m > 0", bool, "fleet idle-allocation cost"
    )
    await stack.eventually("queue:gpu_allocated_seconds:rate5m", bool, "GPUs held per Kueue queue")


def firing(stack: Stack, receiver: str, alertname: str) -> set[tuple[str, ...]]:
    """(instance, gpu, link) of every firing ``alertname`` that reached ``receiver``."""
    return {
        (a["labels"]["instance"], a["labels"].get("gpu", ""), a["labels"].get("link", ""))
        for a in stack.webhook.alerts(receiver)
        if a["labels"]["alertname"] == alertname
    }


async def test_an_nvlink_link_down_pages_infra_for_that_link_only(stack: Stack) -> None:
    node_a = stack.exporters["node-a"].address
    alert = await stack.webhook.wait_for_alert(
        "infra-pager",
        lambda labels: labels.get("alertname") == "GPUNVLinkDown",
    )
    assert alert["annotations"]["runbook_url"].endswith("#gpunvlinkdown")
    assert firing(stack, "infra-pager", "GPUNVLinkDown") == {(node_a, "3", "5")}, (
        "only the injected link may be reported down"
    )


async def test_a_pcie_link_trained_down_reaches_infra_and_idle_gpus_do_not(stack: Stack) -> None:
    node_c = stack.exporters["node-c"].address
    await stack.webhook.wait_for_alert(
        "infra-tickets",
        lambda labels: labels.get("alertname") == "GPUPCIeLinkDegraded",
    )
    assert firing(stack, "infra-tickets", "GPUPCIeLinkDegraded") == {(node_c, "1", "")}, (
        "idle GPUs run at Gen1 by design and must not be reported degraded"
    )


async def test_a_gpu_missing_since_boot_pages_infra_for_its_node(stack: Stack) -> None:
    node_c = stack.exporters["node-c"].address
    alert = await stack.webhook.wait_for_alert(
        "infra-pager",
        lambda labels: labels.get("alertname") == "GPUMissing",
    )
    assert alert["labels"]["instance"] == node_c
    assert firing(stack, "infra-pager", "GPUMissing") == {(node_c, "", "")}


# ---- the same answers as before the series cut (tests/ops/answers.py) ---------------------------

# A panel that reads a reshaped family, and the recorded answer it must still give.
BASELINE_FOR = {
    # links per GPU by state, where it listed every link (docs/migration.md)
    "gpu-node-detail.json|NVLink link state|A": "equivalent:nvlink links by state",
}

# The per-node levels the scale-out rules added after the answers were recorded (docs/operations.md,
# "Rules that scale"): new series with no earlier answer. The fleet, reason, domain and namespace
# rollups now summed from them are recorded, and compared like every other answer.
NEW_SINCE_RECORD = frozenset(
    f"rule:{name}"
    for name in (
        "instance:gpu_allocated_seconds:rate5m",
        "instance:gpu_capacity:sum",
        "instance:gpu_clocks_event_devices:count",
        "instance:gpu_schedulable_capacity:sum",
        "instance:gpu_sm_active_capacity:sum",
        "instance:gpu_sm_active_seconds:rate5m",
        "instance:gpu_utilization_capacity:sum",
        "instance:gpu_utilization_seconds:rate5m",
        "instance_domain:gpu_allocated:count",
        "instance_domain:gpu_devices:count",
        "instance_reason:gpu_clocks_event_seconds:rate5m",
        # the node levels of the namespace, queue, Xid and activity-band rollups
        "instance_namespace:gpu_allocated_seconds:rate5m",
        "instance_namespace:gpu_sm_active_seconds:rate5m",
        "instance_namespace:gpu_allocated_idle_seconds:rate5m",
        "instance_namespace:gpu_allocated_idle_seconds:increase1h",
        "instance_namespace:gpu_allocated_cost_per_hour:rate5m",
        "instance_namespace:gpu_allocated_idle_cost_per_hour:rate5m",
        "instance_namespace:gpu_unallocated_use_seconds:rate5m",
        "instance_namespace:gpu_unallocated_use_cost_per_hour:rate5m",
        "instance_namespace:gpu_reclaimable:sum",
        "instance_queue:gpu_allocated_seconds:rate5m",
        "instance_queue:gpu_sm_active_seconds:rate5m",
        "instance_queue:gpu_allocated_idle_seconds:rate5m",
        "instance_queue:gpu_allocated_idle_cost_per_hour:rate5m",
        "instance_class:gpu_xid_class_errors:rate5m",
        "instance_class:gpu_xid_class_errors:increase1h",
        "instance_band:gpu_allocation_sm_activity_band_seconds:rate5m",
    )
)

# Recorded before and gone since (docs/migration.md): nothing reads them any more, and they
# must not come back unnoticed.
REMOVED_SINCE_RECORD = frozenset(
    {
        # instance:gpu_allocated_seconds:rate5m sums the node's namespaces instead.
        "rule:device:gpu_allocated_seconds:rate5m",
        # a recorded copy of a raw family (issue 34); instance_reason: and reason: remain.
        "rule:device:gpu_clocks_event_seconds:rate5m",
    }
)

# Per-GPU health panels that now show the top GPUs with something to show (`topk(20, ... > 0)`,
# docs/operations.md "Dashboards that scale"), not a line per GPU: their answer is the recorded
# one without its zeros (20 is more than the e2e stack's devices, so topk keeps every other one).
TOP_NONZERO = frozenset(
    {
        "gpu-health.json|ECC errors (since driver load)|A",
        "gpu-health.json|Thermal and power-brake throttling per GPU|A",
    }
)

# Exporter-health panels that now draw one line per collector, its worst node among those
# selected (a line per node and collector is thousands across a fleet): their answer is the
# recorded one aggregated so.
PER_COLLECTOR = {
    "gpu-health.json|Collector success|A": min,
    "gpu-health.json|Sample age|A": max,
}


# Panels that now read a recorded rate per node (docs/operations.md "Dashboards that scale") in
# another unit than before: Xids per hour over 5 min, where it counted them per panel interval.
# The same series (labels) answer; their values are not the recorded ones.
NOW_RECORDED_RATES = frozenset({"gpu-health.json|Xids by class|A"})


def without_zeros(answer: dict[str, Any]) -> dict[str, Any]:
    return dict(answer, result=[item for item in answer["result"] if item[1] != 0])


def per_collector(answer: dict[str, Any], worst: Callable[[list[float]], float]) -> dict[str, Any]:
    values: dict[str, list[float]] = {}
    for labels, value in answer["result"]:
        values.setdefault(dict(map(tuple, labels))["collector"], []).append(value)
    result = [[[["collector", name]], worst(found)] for name, found in sorted(values.items())]
    return dict(answer, result=result)


# Series now served only on request (docs/migration.md, "Fewer series"): the self-metrics of the
# thresholds collector (off by default), and the clock-event reasons that are not throttling
# (--collector.clock-events.detail). A recorded answer keeps its other label sets.
OFF_BY_DEFAULT = {
    ("collector", "thresholds"),
    *(("reason", r) for r in ("gpu_idle", "applications_clocks_setting", "sync_boost")),
    ("reason", "display_clock_setting"),
}
# Queries that read only a family now behind a detail flag: empty at defaults. The PCIe AER
# counters (--collector.pcie.errors), the FP pipes (--collector.pipes.detail) and SM occupancy
# (--collector.activity.detail) that dcgm-exporter's compatibility series read; dcgm-exporter's
# own defaults have none of them.
DETAIL_ONLY = frozenset(
    {
        "gpu-node-detail.json|PCIe replays and errors|B",
        "rule:DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "rule:DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "rule:DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "rule:DCGM_FI_PROF_SM_OCCUPANCY",
    }
)


# Types that now add up into one per GPU (docs/migration.md): the NVLink flit and data CRC errors
# are one "crc" type. A recorded answer's series of the old types are summed per label set.
SUMMED_TYPES = {"crc_flit": "crc", "crc_data": "crc"}
TYPES_SUMMED = frozenset({"gpu-node-detail.json|NVLink errors|A"})


def with_types_summed(answer: dict[str, Any]) -> dict[str, Any]:
    summed: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, value in answer["result"]:
        pairs = tuple(
            (name, SUMMED_TYPES.get(label, label) if name == "type" else label)
            for name, label in labels
        )
        summed[pairs] = summed.get(pairs, 0.0) + value
    return dict(answer, result=[[list(map(list, k)), v] for k, v in sorted(summed.items())])


def without_off_collectors(answer: dict[str, Any]) -> dict[str, Any]:
    kept = [item for item in answer["result"] if not OFF_BY_DEFAULT & set(map(tuple, item[0]))]
    return dict(answer, result=kept)


def kit_queries() -> tuple[list[tuple[str, str]], list[str]]:
    """(key, PromQL) of every dashboard target and dcgm-exporter panel; every recorded name."""
    found = []
    for name, dashboard in dashboards().items():
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                key = f"{name}|{panel['title']}|{target.get('refId', '')}"
                found.append((key, substitute(target["expr"])))
    for query in load_yaml(DCGM_DASHBOARD)["queries"]:
        found.append((f"dcgm-exporter|{query['panel']}", substitute(query["expr"])))
    records = [
        rule["record"]
        for path in E2E_RULE_FILES
        for group in load_yaml(path)["groups"]
        for rule in group["rules"]
        if "record" in rule
    ]
    return found, sorted(set(records))


async def test_every_panel_rule_and_alert_answers_as_it_did_before(stack: Stack) -> None:
    """Each dashboard query, recorded series and the firing alerts give the recorded answers."""
    # Last in the module: by now every incident has fired its alerts and the windows are full.
    nodes = {exporter.address: name for name, exporter in stack.exporters.items()}
    queries, records = kit_queries()
    if os.environ.get(answers.RECORD_ENV):
        await asyncio.sleep(float(os.environ[answers.RECORD_ENV]))
        answers.write(await answers.collect(stack.query, nodes, queries, records))
        return
    recorded = answers.load()
    current = dict(queries) | {f"rule:{name}": name for name in records}
    assert not REMOVED_SINCE_RECORD & set(current), "a removed recording is back: record it"
    assert set(recorded) >= REMOVED_SINCE_RECORD, "a removed recording was never recorded"
    current = {key: expr for key, expr in current.items() if key not in NEW_SINCE_RECORD}
    # The fleet has no Slurm node: the Slurm row and rules answer nothing here, and are checked
    # with data by alerts/tests/slurm_rules_test.yml instead.
    current = {k: e for k, e in current.items() if not any(m in e for m in SLURM_METRICS)}
    unrecorded = sorted(set(current) - set(recorded) - set(BASELINE_FOR))
    assert not unrecorded, f"queries with no recorded answer (record them on main): {unrecorded}"
    expected = {
        key: without_off_collectors(recorded[BASELINE_FOR.get(key, key)]) for key in current
    }
    expected.update({key: without_zeros(expected[key]) for key in TOP_NONZERO})
    expected.update({key: with_types_summed(expected[key]) for key in TYPES_SUMMED})
    expected.update({key: dict(expected[key], result=[]) for key in DETAIL_ONLY})
    expected.update({key: per_collector(expected[key], f) for key, f in PER_COLLECTOR.items()})
    expected.update({key: dict(expected[key], compare="labels") for key in NOW_RECORDED_RATES})
    expected["alerts"] = recorded["alerts"]
    deadline = time.monotonic() + DEADLINE
    while True:
        wrong = {}
        for key, want in expected.items():
            expr = current.get(key, answers.FIRED)
            result = answers.normalise(await stack.query(expr), nodes)
            reason = answers.differs(want, result)
            if reason:
                wrong[key] = f"{expr}: {reason}"
        if not wrong or time.monotonic() > deadline:
            break
        await asyncio.sleep(1.0)
    assert not wrong, "answers that changed:\n" + "\n".join(f"{k}: {v}" for k, v in wrong.items())
