"""The status page as HTML (no JavaScript, no external asset) and as JSON.

Every value that can come from outside (pod and container names from the kubelet, model names
and reasons from a scenario or a driver) goes through :func:`_e`, so markup in a pod name renders
as text. The page reads top to bottom in a terminal browser: a table per topic, each value also
written as text next to its bar.
"""

from __future__ import annotations

import html
import time
from dataclasses import asdict
from typing import Any

from .model import DeviceStatus, Holder, NodeStatus, UnheldProcess, XidRow

SCHEMA_VERSION = 1
_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#111}
h1{font-size:1.4em;margin:0 0 .3em} h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;width:100%} th,td{border-bottom:1px solid #ccc;padding:.25em .5em;
text-align:left;vertical-align:top} th{background:#f2f2f2}
tr.mig td:first-child{padding-left:1.5em} .muted{color:#666}
.bar{display:inline-block;width:5em;height:.7em;border:1px solid #888;vertical-align:middle}
.bar>span{display:block;height:100%;background:#3a7}
.bar.util>span{background:#999} .bad{color:#b00;font-weight:bold} .warn{color:#a60}
.ok{color:#070} .idle{background:#fff4d6} .nowrap{white-space:nowrap}
@media print{.noprint{display:none} .bar{border-color:#000} .bar>span{background:#000}}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def render_html(status: NodeStatus, *, refresh: int | None = None) -> str:
    head = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>gpu-exporter: node status</title>{head}<style>{_STYLE}</style></head>\n<body>\n"
        f"{_header(status, refresh)}{_devices_table(status.devices)}{_xid_table(status.xids)}"
        f"{_sources(status)}</body></html>\n"
    )


def _header(status: NodeStatus, refresh: int | None) -> str:
    health = (
        '<span class="ok">healthy</span>'
        if status.healthy
        else '<span class="bad">sampler stalled</span>'
    )
    again = f"every {refresh} s" if refresh else '<a href="?refresh=5">every 5 s</a>'
    return (
        f"<h1>gpu-exporter {_e(status.version)}</h1>\n"
        f"<p>Driver {_e(status.driver_version or 'unknown')} · exporter {health} · "
        f"ready: {'yes' if status.ready else 'no'} · "
        f"{sum(d.kind == 'gpu' for d in status.devices)} GPUs, "
        f"{sum(d.kind == 'mig' for d in status.devices)} MIG instances</p>\n"
        f'<p class="noprint">{_LINKS} · refresh {again}</p>\n'
    )


_LINKS = " · ".join(
    f'<a href="{path}">{path}</a>' for path in ("/metrics", "/status.json", "/healthz", "/readyz")
)
_COLUMNS = (
    "GPU",
    "Model / profile",
    "Held by",
    "SM active",
    "Tensor active",
    "NVML util",
    "Memory",
    "Power",
    "Temp",
    "Throttling",
    "Links",
    "Health",
)


def _devices_table(devices: tuple[DeviceStatus, ...]) -> str:
    header = "".join(f'<th scope="col">{name}</th>' for name in _COLUMNS)
    rows = "".join(_device_row(device) for device in devices)
    return f'<h2>Devices</h2>\n<table id="devices"><tr>{header}</tr>\n{rows}</table>\n'


def _device_row(device: DeviceStatus) -> str:
    classes = [device.kind] + (["idle"] if device.idle_allocated else [])
    ident = _e(device.gpu) if device.kind == "gpu" else f"{_e(device.gpu)} MIG"
    cells = (
        f'{ident}<br><small class="muted">{_e(device.uuid or "(unidentified)")}</small>',
        _e(device.mig_profile or device.model),
        _holders_cell(device),
        _bar(device.sm_active, "SM active"),
        _bar(device.tensor_active, "tensor active"),
        _bar(device.utilization, "NVML utilisation", "util"),
        _nowrap(_memory(device.memory_used_bytes, device.memory_total_bytes)),
        _nowrap(_power(device.power_watts, device.power_limit_watts)),
        "" if device.temperature_celsius is None else f"{device.temperature_celsius:.0f} °C",
        _e(", ".join(device.throttle_reasons)) or '<span class="muted">none</span>',
        _links(device),
        _health_cell(device),
    )
    tds = "".join(f"<td>{cell}</td>" for cell in cells)
    return (
        f'<tr class="{" ".join(classes)}" data-uuid="{_e(device.uuid)}" '
        f'data-kind="{device.kind}">{tds}</tr>\n'
    )


def _bar(ratio: float | None, what: str, kind: str = "") -> str:
    if ratio is None:
        return '<span class="muted">n/a</span>'
    percent = max(0.0, min(1.0, ratio)) * 100
    classes = f"bar {kind}" if kind else "bar"
    return (
        f'<span class="{classes}" role="img" aria-label="{what} {percent:.0f}%">'
        f'<span style="width:{percent:.0f}%"></span></span> {percent:.0f}%'
    )


def _holders_cell(device: DeviceStatus) -> str:
    return _held_by(device) + _unheld(device.processes)


def _held_by(device: DeviceStatus) -> str:
    if device.mig_instances:
        return f'<span class="muted">split into {device.mig_instances} MIG instances</span>'
    if not device.holders:
        free = device.allocated is False
        return '<span class="muted">free</span>' if free else '<span class="muted">-</span>'
    lines = "<br>".join(_holder(holder) for holder in device.holders)
    sharing = f' <small class="muted">({_e(device.sharing)})</small>' if device.sharing else ""
    idle = '<br><span class="warn">allocated but idle</span>' if device.idle_allocated else ""
    return f"{lines}{sharing}{idle}"


def _unheld(processes: tuple[UnheldProcess, ...]) -> str:
    """Each process on the device that its pod does not hold, with its class and command name
    (escaped: a process names itself)."""
    rows = []
    for p in processes:
        who = f"{p.namespace}/{p.pod}" if p.pod else ""
        memory = _gib(p.memory_used_bytes) if p.memory_used_bytes is not None else ""
        detail = ", ".join(x for x in (who, f"pid {p.pid}", memory) if x)
        rows.append(
            f'<br><span class="warn">{_e(p.process_class)}</span> '
            f'<code>{_e(p.command or "?")}</code> <small class="muted">{_e(detail)}</small>'
        )
    return "".join(rows)


def _holder(holder: Holder) -> str:
    extra = []
    if holder.sm_active is not None:
        # NVML's per-process SM utilisation (docs/allocation.md), not GPM SM activity.
        extra.append(f"util {holder.sm_active * 100:.0f}%")
    if holder.memory_used_bytes is not None:
        extra.append(_gib(holder.memory_used_bytes))
    if holder.idle_seconds:
        extra.append(f"idle {_duration(holder.idle_seconds)}")
    if holder.path:
        better = f" (best {holder.best_path})" if holder.best_path != holder.path else ""
        extra.append(f"path {holder.path}{better}")
    if holder.numa_aligned is not None:
        extra.append(f"NUMA {holder.numa_aligned * 100:.0f}%")
    if holder.sm_bands is not None:
        b = holder.sm_bands
        shares = "/".join(f"{share * 100:.0f}" for share in (b.low, b.mid, b.high))
        extra.append(f"SM low/mid/high {shares}%")
    detail = f' <small class="muted">{_e(", ".join(extra))}</small>' if extra else ""
    name = f"{holder.namespace}/{holder.pod}/{holder.container}"
    unheld = ' <span class="warn">no allocation</span>' if holder.source == "process" else ""
    return f'<span class="holder">{_e(name)}</span>{unheld}{detail}'


def _nowrap(text: str) -> str:
    return f'<span class="nowrap">{text}</span>' if text else ""


def _memory(used: float | None, total: float | None) -> str:
    if used is None or total is None:
        return ""
    return f"{_gib(used)} / {_gib(total)}"


def _power(watts: float | None, limit: float | None) -> str:
    if watts is None:
        return ""
    return f"{watts:.0f} W" + (f" / {limit:.0f} W" if limit else "")


def _links(device: DeviceStatus) -> str:
    link = device.interconnect
    parts = []
    if link.nvlink_links:
        cls = "bad" if link.nvlink_active != link.nvlink_links else ""
        parts.append(
            f'<span class="nowrap {cls}">NVLink {link.nvlink_active}/{link.nvlink_links}</span>'
        )
    if link.pcie_width is not None:
        narrow = link.pcie_max_width is not None and link.pcie_width < link.pcie_max_width
        width = f"x{link.pcie_width:.0f}" + (f"/x{link.pcie_max_width:.0f}" if narrow else "")
        gen = f"Gen{link.pcie_generation:.0f}" if link.pcie_generation is not None else ""
        parts.append(f'<span class="nowrap{" bad" if narrow else ""}">PCIe {gen} {width}</span>')
    return "<br>".join(parts)


def _health_cell(device: DeviceStatus) -> str:
    health = device.health
    if not health.up:
        return '<span class="bad">lost</span>'
    notes = [f'<span class="bad">drain: {_e(r)}</span>' for r in health.drain_reasons]
    if health.row_remap_failed:
        notes.append('<span class="bad">row remap failed</span>')
    if health.row_remap_pending:
        notes.append('<span class="warn">row remap pending</span>')
    if health.uncorrected_ecc:
        notes.append(f'<span class="warn">{health.uncorrected_ecc:.0f} uncorrected ECC</span>')
    if health.recovery_action:
        notes.append(f'<span class="bad">recovery: {_e(health.recovery_action)}</span>')
    return "<br>".join(notes) or '<span class="ok">ok</span>'


def _xid_table(xids: tuple[XidRow, ...]) -> str:
    if not xids:
        return '<h2>Recent Xids</h2>\n<p class="muted">None since the journal began.</p>\n'
    header = "".join(
        f'<th scope="col">{name}</th>'
        for name in ("Last seen (UTC)", "GPU", "Xid", "Class", "Action", "Count", "Pods")
    )
    rows = "".join(
        f'<tr class="xid {_e(x.xid_class)}"><td>{_utc(x.timestamp)}</td><td>{_e(x.gpu)}</td>'
        f"<td>{_e(x.xid)}</td><td>{_e(x.xid_class)}</td><td>{_e(x.action)}</td>"
        f"<td>{x.count:.0f}</td><td>{_e(', '.join(x.pods)) or '-'}</td></tr>\n"
        for x in xids
    )
    return f'<h2>Recent Xids</h2>\n<table id="xids"><tr>{header}</tr>\n{rows}</table>\n'


def _sources(status: NodeStatus) -> str:
    items = "".join(
        f"<li>{_e(name)}: {_up(up)}</li>" for name, up in sorted(status.sources.items())
    )
    problems = "".join(f'<li class="warn">{_e(problem)}</li>' for problem in status.problems)
    return (
        f'<h2>Sources</h2>\n<ul id="sources">{items}</ul>\n'
        f'<h2>Exporter</h2>\n<ul id="problems">{problems or "<li>nothing degraded</li>"}</ul>\n'
    )


def _up(up: bool) -> str:
    return '<span class="ok">up</span>' if up else '<span class="bad">down</span>'


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _utc(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(timestamp))


def to_json(status: NodeStatus) -> dict[str, Any]:
    """The same data for scripts; ``docs/status.md`` and ``data/status.schema.json`` describe it."""
    document = asdict(status)
    document["schema_version"] = SCHEMA_VERSION
    for device, entry in zip(status.devices, document["devices"], strict=True):
        entry["idle_allocated"] = device.idle_allocated
        entry["health"]["ok"] = device.health.ok
    return document
