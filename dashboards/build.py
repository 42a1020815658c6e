"""Build the Grafana dashboards (dashboards/*.json) from this one description.

    python dashboards/build.py           # rewrite the JSON files
    python dashboards/build.py --check   # exit 1 if a JSON file is not what this script builds

The JSON files are committed (import them as they are); tests/ops/test_dashboards.py fails when
they drift from this script. Every panel has a unit, a unique id and a current panel type
(timeseries, stat, table, bargauge); every query uses the ``datasource`` variable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GPU_HOURS = "suffix: GPU·h"
GPUS = "suffix: GPUs"
INSTANCE = 'instance=~"$instance"'


@dataclass
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass
class Panel:
    kind: str  # timeseries | stat | table | bargauge
    title: str
    queries: Sequence[Query]
    unit: str
    width: int = 12
    height: int = 8
    description: str = ""
    max: float | None = None
    stack: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    title: str


Item = Panel | Row


def _layout(items: Sequence[Item]) -> Iterator[dict[str, Any]]:
    x = y = row_height = 0
    panel_id = 0
    for item in items:
        panel_id += 1
        if isinstance(item, Row):
            if x:
                y += row_height
            x, row_height = 0, 0
            yield {
                "id": panel_id,
                "type": "row",
                "title": item.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
            y += 1
            continue
        if x + item.width > 24:
            x, y = 0, y + row_height
            row_height = 0
        yield _panel(item, panel_id, {"h": item.height, "w": item.width, "x": x, "y": y})
        x += item.width
        row_height = max(row_height, item.height)


def _panel(panel: Panel, panel_id: int, grid: dict[str, int]) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.max is not None:
        defaults["min"] = 0
        defaults["max"] = panel.max
    options: dict[str, Any] = {}
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"},
        }
        options = {
            "legend": {"displayMode": "table", "placement": "right", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif panel.kind == "stat":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        }
    elif panel.kind == "bargauge":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
        }
    elif panel.kind == "table":
        options = {"showHeader": True, "cellHeight": "sm"}
    out: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": grid,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": q.expr,
                "legendFormat": q.legend,
                "instant": q.instant or panel.kind == "table",
                "range": not (q.instant or panel.kind == "table"),
                "format": "table" if panel.kind == "table" else "time_series",
            }
            for i, q in enumerate(panel.queries)
        ],
    }
    if panel.kind == "table":
        out["transformations"] = [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {"excludeByName": {"Time": True, "__name__": True, "job": True}},
            },
        ]
    out.update(panel.extra)
    return out


def _variables(*extra: dict[str, Any]) -> dict[str, Any]:
    datasource = {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
    }
    return {"list": [datasource, *extra]}


def _query_variable(
    name: str, label: str, query: str, *, multi: bool = True, include_all: bool = True
) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,
        "sort": 3,
        "multi": multi,
        "includeAll": include_all,
        "allValue": ".*",
        "current": {},
        "hide": 0,
        "regex": "",
    }


def _dashboard(
    uid: str, title: str, description: str, items: Sequence[Item], variables: dict[str, Any]
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gpu", "gpu-exporter"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "timezone": "",
        "annotations": {"list": []},
        "links": [
            {
                "type": "dashboards",
                "tags": ["gpu-exporter"],
                "title": "GPU dashboards",
                "asDropdown": True,
            }
        ],
        "templating": variables,
        "panels": list(_layout(items)),
    }


# ---- (a) fleet efficiency -----------------------------------------------------------------------

NS = 'namespace=~"$namespace"'
# The fleet's held time per SM activity band, summed per node by the rules (not per holder).
BANDS = "instance_band:gpu_allocation_sm_activity_band_seconds:rate5m"


def fleet() -> dict[str, Any]:
    items: list[Item] = [
        Row("Fleet"),
        Panel(
            "stat",
            "GPU capacity",
            [Query("fleet:gpu_capacity:sum")],
            GPUS,
            width=4,
            height=4,
            description="Schedulable GPUs in whole-GPU equivalents (a 3g MIG instance is 3/7).",
        ),
        Panel(
            "stat",
            "Allocated",
            [Query("fleet:gpu_allocated:ratio_rate5m")],
            "percentunit",
            width=5,
            height=4,
            max=1,
            description="Share of the capacity held by pods (5m).",
        ),
        Panel(
            "stat",
            "SM active",
            [Query("fleet:gpu_sm_active:ratio_rate5m")],
            "percentunit",
            width=5,
            height=4,
            max=1,
            description="Mean SM activity of the capacity (5m).",
        ),
        Panel(
            "stat",
            "Allocated, not computing",
            [Query("fleet:gpu_allocation_activity_gap:ratio_rate5m")],
            "percentunit",
            width=5,
            height=4,
            max=1,
            description="Allocated minus SM active: paid for and not used.",
        ),
        Panel(
            "stat",
            "Allocated and idle",
            [Query("fleet:gpu_allocated_idle:ratio_rate5m")],
            "percentunit",
            width=5,
            height=4,
            max=1,
            description="Share of the capacity held by pods whose GPU was idle.",
        ),
        Panel(
            "timeseries",
            "Allocation and SM activity",
            [
                Query("fleet:gpu_allocated:ratio_rate5m", "allocated"),
                Query("fleet:gpu_sm_active:ratio_rate5m", "SM active"),
            ],
            "percentunit",
            max=1,
            description="What the scheduler gave out against what the SMs did (exact 5m "
            "means from the _seconds_total counters).",
        ),
        Panel(
            "timeseries",
            "Gap: allocated but not computing",
            [
                Query("fleet:gpu_allocation_activity_gap:ratio_rate5m", "gap"),
                Query("fleet:gpu_allocated_idle:ratio_rate5m", "allocated and idle"),
            ],
            "percentunit",
            max=1,
        ),
        Row("Namespaces"),
        Panel(
            "bargauge",
            "Idle-allocated GPU-hours by namespace (time range)",
            [
                Query(
                    "sort_desc(sum by (namespace) (avg_over_time("
                    "namespace:gpu_allocated_idle_seconds:rate5m{" + NS + "}[$__range]))"
                    " * $__range_s / 3600)",
                    "{{namespace}}",
                    instant=True,
                )
            ],
            GPU_HOURS,
            height=9,
            description="GPU-hours held while idle over the dashboard's range (MIG instances "
            "weighted by slices, a time-sliced GPU divided between its holders), from the "
            "recorded namespace series.",
        ),
        Panel(
            "timeseries",
            "GPUs held by namespace",
            [Query("namespace:gpu_allocated_seconds:rate5m{" + NS + "}", "{{namespace}}")],
            GPUS,
            height=9,
            stack=True,
        ),
        Panel(
            "timeseries",
            "SM activity of what each namespace holds",
            [Query("namespace:gpu_sm_active:ratio_rate5m{" + NS + "}", "{{namespace}}")],
            "percentunit",
            max=1,
        ),
        Panel(
            "timeseries",
            "Idle GPUs held by namespace",
            [Query("namespace:gpu_allocated_idle_seconds:rate5m{" + NS + "}", "{{namespace}}")],
            GPUS,
            stack=True,
        ),
        Panel(
            "table",
            "Longest idle allocations",
            [Query("topk(20, gpu_allocation_idle_streak_seconds{" + NS + "})")],
            "s",
            width=24,
            height=8,
            description="Pods holding a GPU without computing, longest current idle streak "
            "first: candidates to reap.",
            extra={
                "options": {
                    "showHeader": True,
                    "cellHeight": "sm",
                    "sortBy": [{"displayName": "Value", "desc": True}],
                }
            },
        ),
        Row("Looks busy, does little"),
        Panel(
            "timeseries",
            "NVML utilisation against SM activity",
            [
                Query("fleet:gpu_utilization:ratio_rate5m", "NVML utilisation"),
                Query("fleet:gpu_sm_active:ratio_rate5m", "SM active"),
            ],
            "percentunit",
            max=1,
            description="NVML utilisation counts any resident kernel as 100%; SM activity is "
            "what the SMs did. The distance between them is GPUs that look busy.",
        ),
        Panel(
            "table",
            "Busy-looking GPUs doing little",
            [
                Query(
                    "topk(15, device:gpu_utilization_seconds:rate5m - on (instance, job, uuid) "
                    "group_left () device:gpu_sm_active_seconds:rate5m)"
                )
            ],
            "percentunit",
            description="NVML utilisation minus SM activity per device (5m), largest first.",
        ),
        Panel(
            "timeseries",
            "Held GPUs' SM activity shape",
            [
                Query(
                    "sum by (band) ("
                    + BANDS
                    + ") / ignoring (band) group_left () sum("
                    + BANDS
                    + ")",
                    "{{band}}",
                )
            ],
            "percentunit",
            max=1,
            stack=True,
            description="Share of held time whose SM activity was low (<10%), mid (10-50%) "
            "or high (>50%), judged per sample interval. The same mean can be bursts and gaps "
            "(high + low: input-starved) or steady small kernels (mid: a MIG slice may fit).",
        ),
        Panel(
            "table",
            "Holders' SM activity bands (1h)",
            [Query("holder:gpu_sm_band:ratio_rate1h{" + NS + "}", instant=True)],
            "percentunit",
            description="Per pod and device, the share of the last hour in each band. "
            'holder:gpu_sm_shape:info names the shape: "starved" (high and low, little mid, '
            'still bursting: GPUHolderInputStarved) or "steady_low" (mid dominates).',
        ),
        Row("NVLink domains"),
        Panel(
            "stat",
            "Whole NVLink domains free now",
            [Query("fleet:gpu_nvlink_domains_free:count")],
            "none",
            width=6,
            description="Domains (a fabric clique, else a node) with no GPU allocated: where a "
            "job that needs one whole NVLink domain can start right now.",
        ),
        Panel(
            "table",
            "NVLink domains: GPUs, allocated, free",
            [
                Query("domain:gpu_devices:count", "GPUs", instant=True),
                Query("domain:gpu_allocated:count", "allocated", instant=True),
                Query("domain:gpu_free:count", "free", instant=True),
            ],
            "none",
            width=18,
            description="Per NVLink domain: `<cluster_uuid>/<clique_id>` of a fabric clique "
            "(GB200 NVL72), else the node. A job needing N GPUs in one domain fits where free "
            ">= N.",
        ),
        Row("Placement"),
        Panel(
            "table",
            "Multi-GPU pods: weakest path and the best the node had",
            [Query("gpu_allocation_path_info{" + NS + "}", instant=True)],
            "none",
            description="For each pod of two or more GPUs on a node, read once per allocation "
            "change: path is the weakest link between its GPUs (nvlink, pcie_switch, "
            "pcie_host_bridge, numa, system), best_path the best as many free GPUs and its own "
            "had. path != nvlink with best_path = nvlink: GPUPodMissedNVLink.",
        ),
        Panel(
            "table",
            "Pods per NVLink domain",
            [Query("namespace_pod:gpu_nvlink_domain:info{" + NS + "}", instant=True)],
            "none",
            description="The NVLink domain of each pod's GPUs (a fabric clique, else the node). "
            "workload:gpu_fabric_cliques:count counts a workload's cliques (its pods' job-name "
            "label, else their owner): more than one is GPUWorkloadSpansNVLinkDomains.",
        ),
        Panel(
            "table",
            "Containers' CPUs on their GPU's NUMA node",
            [Query("gpu_allocation_numa_aligned_ratio{" + NS + "}", instant=True)],
            "percentunit",
            width=24,
            description="Share of each container's exclusive CPUs (the kubelet's static CPU "
            "manager) on the NUMA node of the GPU it holds; containers without exclusive CPUs "
            "are not listed. 0 on every GPU a container holds: GPUContainerCPUsOffGPUNUMANode.",
        ),
    ]
    variables = _variables(
        _query_variable("namespace", "Namespace", "label_values(gpu_allocation_info, namespace)")
    )
    return _dashboard(
        "gpu-exporter-fleet",
        "GPU fleet efficiency",
        "Allocation against real SM activity across the fleet and by namespace (gpu-exporter).",
        items,
        variables,
    )


# ---- (b) node and GPU detail --------------------------------------------------------------------

SEL = INSTANCE + ', gpu=~"$gpu"'


SHARED_METRICS = (
    "rate(gpu_container_sm_active_seconds_total{" + SEL + "}[$__rate_interval])",
    "gpu_container_memory_used_bytes{" + SEL + "}",
)
SHARED_JOIN = (
    "* on (instance, uuid) group_left (mode) "
    'gpu_sharing_info{mode=~"time_slicing|mps", ' + SEL + "}"
)


def _unit_override(field: str, unit: str) -> dict[str, Any]:
    return {
        "matcher": {"id": "byName", "options": field},
        "properties": [{"id": "unit", "value": unit}],
    }


def node() -> dict[str, Any]:
    rate = "[$__rate_interval]"
    items: list[Item] = [
        Row("Inventory"),
        Panel("table", "GPUs", [Query("gpu_info{" + SEL + "}")], "none", width=24, height=6),
        Row("Activity"),
        Panel(
            "timeseries",
            "SM activity",
            [
                Query(
                    "rate(gpu_sm_active_seconds_total{" + SEL + "}" + rate + ")",
                    "{{gpu}} {{mig_profile}} {{uuid}}",
                )
            ],
            "percentunit",
            max=1,
        ),
        Panel(
            "timeseries",
            "NVML utilisation",
            [Query("rate(gpu_utilization_seconds_total{" + SEL + "}" + rate + ")", "{{gpu}}")],
            "percentunit",
            max=1,
        ),
        Panel(
            "timeseries",
            "Tensor core activity",
            [
                Query(
                    "rate(gpu_tensor_active_seconds_total{" + SEL + "}" + rate + ")",
                    "{{gpu}} {{mig_profile}}",
                )
            ],
            "percentunit",
            max=1,
        ),
        Panel(
            "timeseries",
            "Memory bandwidth (DRAM activity)",
            [
                Query(
                    "rate(gpu_dram_active_seconds_total{" + SEL + "}" + rate + ")",
                    "{{gpu}} {{mig_profile}}",
                )
            ],
            "percentunit",
            max=1,
        ),
        Row("Memory, power, thermal"),
        Panel(
            "timeseries",
            "Framebuffer used",
            [
                Query("gpu_memory_used_bytes{" + SEL + "}", "{{gpu}} {{mig_profile}} used"),
                Query("gpu_memory_total_bytes{" + SEL + "}", "{{gpu}} {{mig_profile}} total"),
            ],
            "bytes",
            width=8,
        ),
        Panel(
            "timeseries",
            "Power",
            [
                Query("rate(gpu_energy_joules_total{" + SEL + "}" + rate + ")", "{{gpu}}"),
                Query("gpu_power_limit_watts{" + SEL + "}", "{{gpu}} limit"),
            ],
            "watt",
            width=8,
        ),
        Panel(
            "timeseries",
            "Temperature",
            [Query("gpu_temperature_celsius{" + SEL + "}", "{{gpu}} {{sensor}}")],
            "celsius",
            width=8,
        ),
        Panel(
            "timeseries",
            "SM clock",
            [Query('gpu_clock_hertz{clock="sm", ' + SEL + "}", "{{gpu}}")],
            "hertz",
            width=12,
        ),
        Panel(
            "timeseries",
            # Not stacked: reasons overlap, and hw_slowdown is set together with
            # hw_thermal_slowdown and hw_power_brake_slowdown (nvml.h), so a stack would count
            # one slowdown twice.
            "Clock-event (throttle) time by reason (overlapping)",
            [
                Query(
                    'rate(gpu_clocks_event_seconds_total{reason!="gpu_idle", '
                    + SEL
                    + "}"
                    + rate
                    + ")",
                    "{{gpu}} {{reason}}",
                )
            ],
            "percentunit",
            max=1,
            width=12,
        ),
        Row("Interconnect"),
        Panel(
            "table",
            "NVLink link state",
            [
                Query(
                    # The links that are up are a count; each link that is down is named.
                    "gpu_nvlink_links{" + SEL + "} or label_replace("
                    "count without (link) (gpu_nvlink_link_active{" + SEL + "} == 0)"
                    " or 0 * sum without (state) (gpu_nvlink_links{" + SEL + "}),"
                    ' "state", "inactive", "", "")',
                    "{{gpu}} {{state}}",
                    instant=True,
                )
            ],
            "none",
            width=8,
            description="Links per GPU, active and inactive (absent on PCIe cards); a link that "
            "is down is named by gpu_nvlink_link_active{link} 0 and pages as GPUNVLinkDown.",
        ),
        Panel(
            "timeseries",
            "NVLink errors",
            [
                Query(
                    "rate(gpu_nvlink_errors_total{" + SEL + "}" + rate + ")",
                    "{{gpu}} {{type}}",
                )
            ],
            "cps",
            width=8,
            description="Per GPU, summed over its links; DCGM's limit for CRC errors is 100/s.",
        ),
        Panel(
            "timeseries",
            "PCIe replays and errors",
            [
                Query("rate(gpu_pcie_replays_total{" + SEL + "}" + rate + ")", "{{gpu}} replays"),
                Query("rate(gpu_pcie_errors_total{" + SEL + "}" + rate + ")", "{{gpu}} {{type}}"),
            ],
            "cps",
            width=8,
            description="DCGM's health limit is 8 replays a minute.",
        ),
        Panel(
            "timeseries",
            "NVLink traffic",
            [
                Query(
                    "rate(gpu_nvlink_transmit_bytes_total{" + SEL + "}" + rate + ")", "{{gpu}} tx"
                ),
                Query(
                    "rate(gpu_nvlink_receive_bytes_total{" + SEL + "}" + rate + ")", "{{gpu}} rx"
                ),
            ],
            "Bps",
            width=8,
        ),
        Panel(
            "timeseries",
            "PCIe traffic",
            [
                Query("rate(gpu_pcie_transmit_bytes_total{" + SEL + "}" + rate + ")", "{{gpu}} tx"),
                Query("rate(gpu_pcie_receive_bytes_total{" + SEL + "}" + rate + ")", "{{gpu}} rx"),
            ],
            "Bps",
            width=8,
        ),
        Panel(
            "timeseries",
            "PCIe link width against its maximum",
            [
                Query("gpu_pcie_link_width_lanes{" + SEL + "}", "{{gpu}} lanes"),
                Query("gpu_pcie_link_max_width_lanes{" + SEL + "}", "{{gpu}} max lanes"),
            ],
            "none",
            width=8,
            description="Width below the maximum is a link that trained down. Generation drops "
            "at idle by design, so only width is shown here.",
        ),
        Row("MIG"),
        Panel("table", "MIG instances", [Query("gpu_mig_info{" + SEL + "}")], "none", width=12),
        Panel(
            "timeseries",
            "MIG instance SM activity",
            [
                Query(
                    'rate(gpu_sm_active_seconds_total{uuid=~"MIG-.*", ' + SEL + "}" + rate + ")",
                    "{{gpu}}/{{mig_profile}} gi{{gpu_instance_id}}",
                )
            ],
            "percentunit",
            max=1,
            width=12,
        ),
        Row("Pods"),
        Panel(
            "table", "Allocations", [Query("gpu_allocation_info{" + SEL + "}")], "none", width=12
        ),
        Panel(
            "table",
            "Container GPU memory",
            [Query("gpu_container_memory_used_bytes{" + SEL + "}")],
            "bytes",
            width=12,
        ),
        Panel(
            "table",
            "Shared GPUs: each holder's activity and memory",
            [Query(f"{metric} {SHARED_JOIN}") for metric in SHARED_METRICS],
            "none",
            width=24,
            description="Time-sliced and MPS GPUs (gpu_sharing_info), one row per container: "
            "its own processes' SM share (NVML per-process 'kernel resident' share; container "
            "'' sums processes of no known container) and device memory.",
            extra={
                "fieldConfig": {
                    "defaults": {"unit": "none"},
                    "overrides": [
                        _unit_override("Value #A", "percentunit"),
                        _unit_override("Value #B", "bytes"),
                    ],
                }
            },
        ),
        Row("Placement"),
        Panel(
            "table",
            "Multi-GPU pods: weakest path and best available",
            [Query("gpu_allocation_path_info{" + INSTANCE + "}", instant=True)],
            "none",
            width=12,
            description="path: the weakest link between the pod's GPUs; best_path: the best "
            "as many GPUs among the free ones and its own had (read once per allocation change).",
        ),
        Panel(
            "table",
            "CPUs on the GPU's NUMA node",
            [Query("gpu_allocation_numa_aligned_ratio{" + SEL + "}", instant=True)],
            "percentunit",
            width=12,
            description="Share of the container's exclusive CPUs on the GPU's NUMA node "
            "(absent without the static CPU manager).",
        ),
        Panel(
            "timeseries",
            "SM activity bands per holder",
            [
                Query(
                    "rate(gpu_allocation_sm_activity_band_seconds_total{" + SEL + "}[5m])",
                    "{{namespace}}/{{pod}} gpu {{gpu}} {{band}}",
                )
            ],
            "percentunit",
            width=24,
            max=1,
            description="Share of the holder's time in each SM activity band: a starved pod "
            "splits between high and low, steady small kernels sit in mid.",
        ),
    ]
    variables = _variables(
        _query_variable(
            "instance", "Node", "label_values(gpu_info, instance)", multi=False, include_all=False
        ),
        _query_variable("gpu", "GPU", 'label_values(gpu_info{instance=~"$instance"}, gpu)'),
    )
    return _dashboard(
        "gpu-exporter-node",
        "GPU node and device detail",
        "Per-GPU and per-MIG-instance activity, memory, power, thermals, clocks and pods.",
        items,
        variables,
    )


# ---- (c) health ---------------------------------------------------------------------------------


def health() -> dict[str, Any]:
    rate = "[$__rate_interval]"
    items: list[Item] = [
        Row("Now"),
        Panel(
            "stat",
            "GPUs to drain",
            [
                Query(
                    "count(max by (instance, gpu, uuid) (gpu_drain_recommended{"
                    + INSTANCE
                    + "}) == 1) or vector(0)"
                )
            ],
            "none",
            width=6,
            height=4,
        ),
        Panel(
            "stat",
            "GPUs lost",
            [Query("count(gpu_up{" + INSTANCE + "} == 0) or vector(0)")],
            "none",
            width=6,
            height=4,
        ),
        Panel(
            "stat",
            "Row remaps pending",
            [Query("sum(gpu_row_remap_pending{" + INSTANCE + "}) or vector(0)")],
            "none",
            width=6,
            height=4,
        ),
        Panel(
            "stat",
            "Row remap failures",
            [Query("sum(gpu_row_remap_failed{" + INSTANCE + "}) or vector(0)")],
            "none",
            width=6,
            height=4,
        ),
        Row("Xids"),
        Panel(
            "timeseries",
            "Xids by class",
            [
                Query(
                    "sum by (class) (instance_class:gpu_xid_class_errors:rate5m{"
                    + INSTANCE
                    + "}) * 3600",
                    "{{class}}",
                )
            ],
            "short",
            stack=True,
            description="Xids per hour by class on the nodes selected, a 5 min mean "
            "(instance_class:gpu_xid_class_errors:rate5m, recorded per node: "
            "gpu_xid_class_errors_total starts at 0, so the first Xid shows).",
        ),
        Panel(
            "table",
            "Drain recommended",
            [Query("gpu_drain_recommended{" + INSTANCE + "} == 1")],
            "none",
            description="GPUs with a standing hardware condition, and why.",
        ),
        Panel(
            "table",
            "Latest Xid per GPU and code",
            [Query("topk(50, gpu_xid_last_timestamp_seconds{" + INSTANCE + "}) * 1000")],
            "dateTimeAsIso",
            width=12,
            description="The 50 latest.",
        ),
        Panel(
            "table",
            "Xids counted by pod",
            [
                Query(
                    "sum by (instance, gpu, xid, class, action, namespace, pod) "
                    "(gpu_xid_errors_total{" + INSTANCE + "})"
                )
            ],
            "short",
            width=12,
            description="Xids since the exporter's journal began, with who held the GPU; a "
            "pod's rows leave --xid-pod-retention (7d) after its latest Xid.",
        ),
        Panel(
            "timeseries",
            "NVSwitch SXids",
            [
                Query(
                    "sum by (instance, switch, severity) (gpu_nvswitch_sxid_errors_total{"
                    + INSTANCE
                    + "})",
                    "{{instance}} nvswitch {{switch}} {{severity}}",
                )
            ],
            "short",
            width=24,
            description="NVSwitch SXids from the kernel log, counted since the exporter's journal "
            "began (a step is a new error). Shown as counts, not increases: a switch's series "
            "starts with its first SXid, which an increase would not show. Fatal: the node's "
            "NVLink fabric needs a reset (GPUNVSwitchFatalError); many non-fatal ones on one "
            "switch: a degrading link (GPUNVSwitchErrorBurst).",
        ),
        Row("Memory errors"),
        Panel(
            "timeseries",
            "ECC errors (since driver load)",
            [
                Query(
                    'topk(20, gpu_ecc_errors_total{counter="volatile", ' + INSTANCE + "} > 0)",
                    "{{instance}} gpu {{gpu}} {{type}}",
                )
            ],
            "short",
            width=8,
            description="The 20 GPUs with the most, of those with any: one line per GPU and "
            "type would be thousands across a fleet.",
        ),
        Panel(
            "timeseries",
            "Remapped rows",
            [
                Query(
                    "topk(20, gpu_remapped_rows_total{" + INSTANCE + "})",
                    "{{instance}} gpu {{gpu}} {{cause}}",
                )
            ],
            "short",
            width=8,
            description="The 20 GPUs with the most.",
        ),
        Panel(
            "timeseries",
            "Banks with few spare rows",
            [
                Query(
                    'gpu_row_remap_banks{availability=~"low|none", ' + INSTANCE + "}",
                    "{{instance}} gpu {{gpu}} {{availability}}",
                )
            ],
            "short",
            width=8,
        ),
        Row("Throttling"),
        Panel(
            "timeseries",
            "Fleet share of time throttled by reason",
            [Query('reason:gpu_clocks_event:ratio_rate5m{reason!="gpu_idle"}', "{{reason}}")],
            "percentunit",
            max=1,
        ),
        Panel(
            "timeseries",
            "Thermal and power-brake throttling per GPU",
            [
                Query(
                    'topk(20, rate(gpu_clocks_event_seconds_total{reason=~"hw_thermal_slowdown|'
                    'sw_thermal_slowdown|hw_power_brake_slowdown", '
                    + INSTANCE
                    + "}"
                    + rate
                    + ") > 0)",
                    "{{instance}} gpu {{gpu}} {{reason}}",
                )
            ],
            "percentunit",
            max=1,
            description="The 20 most throttled GPUs and reasons, of those throttled at all.",
        ),
        Panel(
            "timeseries",
            "Hottest GPU per node",
            [
                Query(
                    'max by (instance) (gpu_temperature_celsius{sensor="gpu", ' + INSTANCE + "})",
                    "{{instance}}",
                )
            ],
            "celsius",
        ),
        Panel(
            "timeseries",
            "Node throttle share by reason",
            [
                Query(
                    'instance_reason:gpu_clocks_event:ratio_rate5m{reason!="gpu_idle", '
                    + INSTANCE
                    + "}",
                    "{{instance}} {{reason}}",
                )
            ],
            "percentunit",
            max=1,
        ),
        Row("Exporter"),
        Panel(
            "table", "Sources", [Query("gpu_exporter_source_up{" + INSTANCE + "}")], "bool", width=8
        ),
        Panel(
            "timeseries",
            "Collector success",
            [
                Query(
                    "min by (collector) (gpu_exporter_collector_success{" + INSTANCE + "})",
                    "{{collector}}",
                )
            ],
            "bool",
            width=8,
            description="Per collector, its worst node among those selected (0: a node's last "
            "round failed; GPUExporterCollectorFailing names the node). One line per node and "
            "collector would be thousands across a fleet: pick a node to see its own.",
        ),
        Panel(
            "timeseries",
            "Sample age",
            [
                Query(
                    "max by (collector) (gpu_exporter_sample_age_seconds{" + INSTANCE + "})",
                    "{{collector}}",
                )
            ],
            "s",
            width=8,
            description="Per collector, its oldest sample among the nodes selected "
            "(GPUExporterStaleSamples names the node past a minute): pick a node to see its own.",
        ),
    ]
    variables = _variables(
        _query_variable("instance", "Node", "label_values(gpu_info, instance)"),
    )
    return _dashboard(
        "gpu-exporter-health",
        "GPU health",
        "Xids by class, NVSwitch SXids, drain recommendations, ECC and row remapping, throttling, "
        "exporter health.",
        items,
        variables,
    )


# ---- (d) cost and tenancy ----------------------------------------------------------------------

IDLE_COST = "namespace:gpu_allocated_idle_cost_per_hour:rate5m{" + NS + "}"
QUEUE = 'queue=~"$queue"'


def cost() -> dict[str, Any]:
    """Idle allocation as money, by namespace and Kueue queue (prices: alerts/gpu_prices.yml)."""
    items: list[Item] = [
        Row("Cost of idle allocation"),
        Panel(
            "stat",
            "Idle-allocation cost (time range)",
            [
                Query(
                    "avg_over_time(fleet:gpu_allocated_idle_cost_per_hour:rate5m[$__range])"
                    " * $__range_s / 3600",
                    "spent idle",
                    instant=True,
                )
            ],
            "none",
            width=12,
            height=5,
            description="Money spent on GPUs held by pods while idle over the dashboard's range, "
            "at the prices (and in the currency) set in alerts/gpu_prices.yml.",
        ),
        Panel(
            "stat",
            "Currency",
            [Query("currency:gpu_price:info", "{{currency}}", instant=True)],
            "none",
            width=4,
            height=5,
            description="The currency of every price on this dashboard (alerts/gpu_prices.yml).",
            extra={"options": {"textMode": "name", "reduceOptions": {"calcs": ["lastNotNull"]}}},
        ),
        Panel(
            "stat",
            "Idle-allocation cost now",
            [Query("fleet:gpu_allocated_idle_cost_per_hour:rate5m", "per hour")],
            "none",
            width=8,
            height=5,
        ),
        Panel(
            "bargauge",
            "Idle-allocation cost by namespace (time range)",
            [
                Query(
                    "sort_desc(sum by (namespace) (avg_over_time(" + IDLE_COST + "[$__range]))"
                    " * $__range_s / 3600)",
                    "{{namespace}}",
                    instant=True,
                )
            ],
            "none",
            width=12,
            height=10,
        ),
        Panel(
            "timeseries",
            "Idle-allocation cost per hour by namespace",
            [Query(IDLE_COST, "{{namespace}}")],
            "none",
            stack=True,
        ),
        Panel(
            "timeseries",
            "Allocation cost per hour by namespace",
            [
                Query(
                    "namespace:gpu_allocated_cost_per_hour:rate5m{" + NS + "}",
                    "{{namespace}}",
                )
            ],
            "none",
            stack=True,
            description="What each namespace's allocations cost, idle or not.",
        ),
        Row("Right-sizing"),
        Panel(
            "stat",
            "Reclaimable GPUs",
            [Query("fleet:gpu_reclaimable:sum", "reclaimable")],
            GPUS,
            width=6,
            height=8,
            description="Whole GPUs freed if every whole-GPU holder that fits a MIG profile moved "
            "to it (1 - the profile's compute fraction each); the exporter decides each fit "
            "(docs/allocation.md, Right-sizing).",
        ),
        Panel(
            "table",
            "Reclaimable: whole GPUs whose holder fits a MIG slice",
            [
                Query(
                    'gpu_allocation_smallest_fitting_profile_info{profile!="whole_gpu", '
                    + NS
                    + "} == 1"
                )
            ],
            "none",
            width=18,
            height=8,
            description="Each pod holding a whole GPU whose memory peak (+10%) and SM-activity "
            "p95 over its allocation fit the listed MIG profile: move it there to free the rest.",
        ),
        Panel(
            "bargauge",
            "Reclaimable GPUs by namespace",
            [
                Query(
                    "sort_desc(namespace:gpu_reclaimable:sum{" + NS + "})",
                    "{{namespace}}",
                    instant=True,
                )
            ],
            GPUS,
            width=24,
            height=6,
        ),
        Row("Queues (Kueue)"),
        Panel(
            "timeseries",
            "GPUs held by queue",
            [Query("queue:gpu_allocated_seconds:rate5m{" + QUEUE + "}", "{{namespace}}/{{queue}}")],
            GPUS,
            stack=True,
            description="Needs kube-state-metrics with "
            "--metric-labels-allowlist=pods=[kueue.x-k8s.io/queue-name].",
        ),
        Panel(
            "timeseries",
            "SM activity of what each queue holds",
            [
                Query(
                    "queue:gpu_sm_active_seconds:rate5m{" + QUEUE + "} / "
                    "queue:gpu_allocated_seconds:rate5m{" + QUEUE + "}",
                    "{{namespace}}/{{queue}}",
                )
            ],
            "percentunit",
            max=1,
        ),
        Panel(
            "bargauge",
            "Idle-allocation cost by queue (time range)",
            [
                Query(
                    "sort_desc(sum by (namespace, queue) (avg_over_time("
                    "queue:gpu_allocated_idle_cost_per_hour:rate5m{" + QUEUE + "}[$__range]))"
                    " * $__range_s / 3600)",
                    "{{namespace}}/{{queue}}",
                    instant=True,
                )
            ],
            "none",
            width=24,
        ),
        *_slurm_row(),
    ]
    variables = _variables(
        _query_variable("namespace", "Namespace", "label_values(gpu_allocation_info, namespace)"),
        _query_variable("queue", "Queue", "label_values(namespace_pod:kueue_queue:info, queue)"),
    )
    return _dashboard(
        "gpu-exporter-cost",
        "GPU cost and tenancy",
        "Idle allocation in money by namespace and queue, and what right-sizing would free "
        "(gpu-exporter).",
        items,
        variables,
    )


def _slurm_row() -> list[Item]:
    """Slurm nodes (--allocation.source=slurm): idle GPU-hours and cost per account, user and
    partition, and the jobs holding GPUs idle (docs/slurm.md)."""
    items: list[Item] = [Row("Slurm jobs")]
    for level in ("account", "user", "partition"):
        items.append(
            Panel(
                "bargauge",
                f"Idle GPU-hours by {level} (time range)",
                [
                    Query(
                        f"sort_desc(sum by ({level}) (avg_over_time({level}:gpu_slurm_idle:rate5m"
                        "[$__range])) * $__range_s / 3600)",
                        "{{" + level + "}}",
                        instant=True,
                    )
                ],
                GPU_HOURS,
                width=8,
                description=f"GPU-hours Slurm jobs held idle over the range, by {level}.",
            )
        )
    for level in ("account", "user", "partition"):
        items.append(
            Panel(
                "timeseries",
                f"Idle cost per hour by {level}",
                [Query(f"{level}:gpu_slurm_idle_cost_per_hour:rate5m", "{{" + level + "}}")],
                "none",
                width=8,
                stack=True,
            )
        )
    items.append(
        Panel(
            "table",
            "Jobs holding GPUs idle",
            [
                Query(
                    "sort_desc(max by (instance, gpu, job_id, user, account, partition) ("
                    'gpu_allocation_idle_streak_seconds{job_id!=""}'
                    " * on (instance, job, uuid, job_id) group_left (user, account, partition)"
                    " gpu_slurm_job_info) > 600)",
                    instant=True,
                )
            ],
            "s",
            width=24,
            description="Running jobs whose GPU has been idle for over 10 minutes, longest "
            "first (GPUSlurmJobIdle fires past an hour).",
        )
    )
    return items


DASHBOARDS = {
    "gpu-fleet-efficiency.json": fleet,
    "gpu-node-detail.json": node,
    "gpu-health.json": health,
    "gpu-cost.json": cost,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the files are current")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path = HERE / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)} (run python dashboards/build.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
