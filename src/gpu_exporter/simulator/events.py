"""Validation of timeline and injected events, one entry per event ``type``.

Each type lists its keys and turns the raw mapping into normalised ``params``; the node applies
them (see :mod:`gpu_exporter.simulator.node`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_exporter.simulator import schema as s
from gpu_exporter.simulator.errors import Invalid
from gpu_exporter.simulator.kmsg import SXID_SEVERITY_WORDS
from gpu_exporter.simulator.links import (
    FABRIC_HEALTH,
    NVLINK5_ERROR_TYPES,
    NVLINK_ERROR_TYPES,
    PCIE_ERROR_TYPES,
)
from gpu_exporter.simulator.scenario import (
    ALLOCATION_KEYS,
    KMSG_ONLY_XIDS,
    RECOVERY_ACTIONS,
    THROTTLE_REASONS,
    WORKLOAD_KEYS,
    EventSpec,
    GpuSpec,
    build_allocation,
    build_workload,
    gpu_index,
    mig_layout,
)
from gpu_exporter.simulator.units import parse_duration

MIN_REPEAT_S = 0.1  # the shortest repeat period of a timeline event

Params = dict[str, Any]
Validator = Callable[[Mapping[str, Any], str, Sequence[GpuSpec]], Params]


@dataclass(frozen=True)
class EventType:
    keys: frozenset[str]
    required: frozenset[str]
    validate: Validator


def targets(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> tuple[int, ...]:
    """``gpu``: an index, a list of indices, or ``all``."""
    raw = body.get("gpu")
    if raw == "all":
        return tuple(range(len(gpus)))
    if isinstance(raw, list):
        if not raw:
            raise Invalid(s.key(path, "gpu"), "empty list")
        return tuple(gpu_index(g, s.item(s.key(path, "gpu"), i), gpus) for i, g in enumerate(raw))
    return (gpu_index(raw, s.key(path, "gpu"), gpus),)


def _need(gpus: Sequence[GpuSpec], indices: Sequence[int], path: str, what: str) -> None:
    """Reject memory-repair events on models that lack the mechanism."""
    for i in indices:
        model = gpus[i].model
        ok = model.row_remapping if what == "row_remap" else model.page_retirement
        if not ok:
            mechanism = "row remapping" if what == "row_remap" else "page retirement"
            raise Invalid(s.key(path, "gpu"), f"gpu {i} ({model.key}) has no {mechanism}")


def _xid(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    code = s.integer(body["code"], s.key(path, "code"), 1, 999)
    default = "kmsg" if code in KMSG_ONLY_XIDS else "both"
    params: Params = {
        "gpus": targets(body, path, gpus),
        "code": code,
        "delivery": s.choice(body.get("delivery", default), s.key(path, "delivery"), _DELIVERY),
        "pid": s.integer(body["pid"], s.key(path, "pid"), 1) if "pid" in body else None,
        "process_name": (
            s.text(body["process_name"], s.key(path, "process_name"))
            if "process_name" in body
            else None
        ),
        "message": s.text(body["message"], s.key(path, "message")) if "message" in body else None,
        "mig": None,
    }
    if "mig" in body:
        if len(params["gpus"]) != 1:
            raise Invalid(s.key(path, "mig"), "mig needs a single gpu")
        gpu = gpus[params["gpus"][0]]
        if not gpu.mig:
            raise Invalid(s.key(path, "mig"), f"gpu {gpu.index} has no MIG instances")
        params["mig"] = s.integer(body["mig"], s.key(path, "mig"), 0, len(gpu.mig) - 1)
    return params


_DELIVERY = {"nvml", "kmsg", "both"}


def _sxid(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    """An NVSwitch error: a kernel-log line only (NVML's GPU event API never reports it)."""
    return {
        "switch": s.integer(body["switch"], s.key(path, "switch"), 0, 15),
        "code": s.integer(body["code"], s.key(path, "code"), 1, 99999),
        "severity": s.choice(
            body.get("severity", "non_fatal"), s.key(path, "severity"), SXID_SEVERITY_WORDS
        ),
        "link": s.integer(body.get("link", 0), s.key(path, "link"), 0, 63),
        "message": s.text(body.get("message", "error"), s.key(path, "message")),
    }


def _gpus_only(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    return {"gpus": targets(body, path, gpus)}


def _throttle(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    state = body.get("state", "on")
    # YAML 1.1 reads a bare on/off as a boolean.
    if isinstance(state, bool):
        state = "on" if state else "off"
    reasons = [n for n in THROTTLE_REASONS if n != "gpu_idle"]
    params: Params = {
        "gpus": targets(body, path, gpus),
        "reason": s.choice(body["reason"], s.key(path, "reason"), reasons),
        "state": s.choice(state, s.key(path, "state"), {"on", "off"}),
        "duration": None,
    }
    if "duration" in body:
        if params["state"] != "on":
            raise Invalid(s.key(path, "duration"), "a duration only applies to state: on")
        params["duration"] = parse_duration(body["duration"], s.key(path, "duration"))
    return params


def _ecc(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    indices = targets(body, path, gpus)
    for i in indices:
        if not gpus[i].ecc:
            raise Invalid(s.key(path, "gpu"), f"ECC is disabled on gpu {i}")
    corrected = s.integer(body.get("corrected", 0), s.key(path, "corrected"), 0)
    uncorrected = s.integer(body.get("uncorrected", 0), s.key(path, "uncorrected"), 0)
    if corrected == uncorrected == 0:
        raise Invalid(path, "give corrected and/or uncorrected counts")
    return {"gpus": indices, "corrected": corrected, "uncorrected": uncorrected}


def _row_remap(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    indices = targets(body, path, gpus)
    _need(gpus, indices, path, "row_remap")
    cause = s.choice(
        body.get("cause", "uncorrectable"), s.key(path, "cause"), {"correctable", "uncorrectable"}
    )
    return {
        "gpus": indices,
        "cause": cause,
        "rows": s.integer(body.get("rows", 1), s.key(path, "rows"), 1),
    }


def _row_remap_failure(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    indices = targets(body, path, gpus)
    _need(gpus, indices, path, "row_remap")
    return {"gpus": indices}


def _retired_pages(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    indices = targets(body, path, gpus)
    _need(gpus, indices, path, "page_retirement")
    return {
        "gpus": indices,
        "cause": s.choice(
            body.get("cause", "double_bit"), s.key(path, "cause"), {"single_bit", "double_bit"}
        ),
        "count": s.integer(body.get("count", 1), s.key(path, "count"), 1),
        "pending": s.boolean(body.get("pending", True), s.key(path, "pending")),
    }


def _recovery_action(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    return {
        "gpus": targets(body, path, gpus),
        "action": s.choice(body["action"], s.key(path, "action"), RECOVERY_ACTIONS),
    }


def _field_value(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    """A field answers this value (until ``state: off``): a counter stuck, reset or racing."""
    state = body.get("state", "on")
    if isinstance(state, bool):  # YAML 1.1 reads a bare on/off as a boolean
        state = "on" if state else "off"
    state = s.choice(state, s.key(path, "state"), ("on", "off"))
    if state == "on" and "value" not in body:
        raise Invalid(s.key(path, "value"), "required key is missing")
    return {
        "gpus": targets(body, path, gpus),
        "field": s.integer(body["field"], s.key(path, "field"), 1, 1023),
        "value": s.integer(body.get("value", 0), s.key(path, "value"), -(2**63), 2**64 - 1),
        "value_type": s.integer(body.get("value_type", 3), s.key(path, "value_type"), 0, 6),
        "on": state == "on",
    }


def _mig_reconfigure(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    """Destroy one MIG GPU's instances and create the listed ones (MIG mode stays on)."""
    gpu = gpus[gpu_index(body.get("gpu"), s.key(path, "gpu"), gpus)]
    if gpu.mig is None:
        raise Invalid(s.key(path, "gpu"), f"gpu {gpu.index} is not in MIG mode")
    return {"gpu": gpu.index, "layout": mig_layout(body["mig"], s.key(path, "mig"), gpu.model)}


def _allocate(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    from gpu_exporter.simulator.scenario import device_of

    gpu, mig = device_of(body, path, gpus)
    params: Params = {"allocation": build_allocation(body, path, gpus[gpu], mig), "workload": None}
    if "workload" in body:
        wpath = s.key(path, "workload")
        raw = s.mapping(body["workload"], wpath, WORKLOAD_KEYS - {"gpu", "mig", "pod", "namespace"})
        merged = {"pod": body["pod"], "namespace": body.get("namespace", "default"), **raw}
        merged.setdefault("container", body.get("container", "main"))
        params["workload"] = build_workload(merged, wpath, gpu, mig)
    return params


def _release(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    return {
        "pod": s.text(body["pod"], s.key(path, "pod")),
        "namespace": s.text(body.get("namespace", "default"), s.key(path, "namespace")),
        "gpu": gpu_index(body["gpu"], s.key(path, "gpu"), gpus) if "gpu" in body else None,
    }


def _workload_start(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    """A process starts on a device now: a ``workloads`` entry (checked for its form only, as
    ``allocate`` is), with the ``pid`` that ``workload_stop`` names it by."""
    from gpu_exporter.simulator.scenario import device_of

    gpu, mig = device_of(body, path, gpus)
    return {"workload": build_workload(body, path, gpu, mig)}


def _workload_stop(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    return {"pid": s.integer(body["pid"], s.key(path, "pid"), 1, 2**22)}


def _hang(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    from gpu_exporter.simulator.dcgm_library import DCGM_FUNCTIONS
    from gpu_exporter.simulator.library import C_FUNCTIONS  # the library needs this module

    if "function" not in body and "gpu" not in body:
        raise Invalid(path or "event", "a hang needs a function, a gpu, or both")
    params: Params = {
        "function": s.choice(
            body["function"], s.key(path, "function"), C_FUNCTIONS | DCGM_FUNCTIONS
        )
        if "function" in body
        else None,  # every call on the GPU: the device itself is stuck
        "gpu": gpu_index(body["gpu"], s.key(path, "gpu"), gpus) if "gpu" in body else None,
        "duration": None,
    }
    if "duration" in body:
        params["duration"] = parse_duration(body["duration"], s.key(path, "duration"))
    return params


def _unhang(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    return {
        "function": s.text(body["function"], s.key(path, "function"))
        if "function" in body
        else None,
        "gpu": gpu_index(body["gpu"], s.key(path, "gpu"), gpus) if "gpu" in body else None,
    }


# Error codes an injected failure may return (nvml.h); names as the exporter labels them.
NVML_ERROR_CODES: Mapping[str, int] = {
    "unknown": 999,
    "timeout": 10,
    "no_permission": 4,
    "insufficient_power": 8,
    "irq_issue": 11,
    "corrupted_inforom": 14,
    "memory": 20,
    "no_data": 21,
    "gpu_is_lost": 15,  # from one function only: the GPU still answers the others
    "invalid_argument": 2,
    "not_supported": 3,
    "function_not_found": 13,  # also a real driver's answer to a struct version it does not take
    "argument_version_mismatch": 25,
}


def _nvml_error(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    from gpu_exporter.simulator.library import C_FUNCTIONS  # the library needs this module

    state = s.choice(body.get("state", "on"), s.key(path, "state"), ("on", "off"))
    return {
        "function": s.choice(body["function"], s.key(path, "function"), C_FUNCTIONS),
        "gpu": gpu_index(body["gpu"], s.key(path, "gpu"), gpus) if "gpu" in body else None,
        "code": NVML_ERROR_CODES[
            s.choice(body.get("error", "unknown"), s.key(path, "error"), NVML_ERROR_CODES)
        ],
        "on": state == "on",
        "every": s.integer(body.get("every", 1), s.key(path, "every"), low=1),
        "times": s.integer(body["times"], s.key(path, "times"), low=1) if "times" in body else None,
    }


def _nvlink_gpus(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> tuple[int, ...]:
    indices = targets(body, path, gpus)
    for i in indices:
        if gpus[i].model.nvlink is None:
            raise Invalid(s.key(path, "gpu"), f"gpu {i} ({gpus[i].model.key}) has no NVLink")
    return indices


def _links(
    body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec], indices: Sequence[int]
) -> Any:
    """``link``: an index, a list of indices or ``all`` (default 0), within every target's links."""
    raw = body.get("link", 0)
    if raw == "all":
        return "all"
    where = s.key(path, "link")
    links = raw if isinstance(raw, list) else [raw]
    if not links:
        raise Invalid(where, "empty list")
    fewest = min(nvlink.links for i in indices if (nvlink := gpus[i].model.nvlink) is not None)
    return tuple(s.integer(link, where, 0, fewest - 1) for link in links)


def _nvlink_down(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    indices = _nvlink_gpus(body, path, gpus)
    return {"gpus": indices, "links": _links(body, path, gpus, indices)}


def _nvlink_errors(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    indices = _nvlink_gpus(body, path, gpus)
    counts = {
        kind: s.integer(body.get(kind, 0), s.key(path, kind), 0)
        for kind in (*NVLINK_ERROR_TYPES, *NVLINK5_ERROR_TYPES)
    }
    if not any(counts.values()):
        raise Invalid(path, "give at least one error count (e.g. crc_flit: 100)")
    return {"gpus": indices, "links": _links(body, path, gpus, indices), "counts": counts}


def _pcie_downtrain(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    indices = targets(body, path, gpus)
    fewest = min(gpus[i].model.pcie_width for i in indices)
    lowest = min(gpus[i].model.pcie_generation for i in indices)
    width = s.integer(body.get("width", fewest // 2), s.key(path, "width"), 1, fewest)
    generation = s.integer(body.get("generation", lowest), s.key(path, "generation"), 1, lowest)
    return {"gpus": indices, "width": width, "generation": generation}


def _pcie_errors(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    counts = {
        kind: s.integer(body.get(kind, 0), s.key(path, kind), 0)
        for kind in ("replays", *PCIE_ERROR_TYPES)
    }
    if not any(counts.values()):
        raise Invalid(path, "give at least one count (e.g. replays: 50)")
    return {"gpus": targets(body, path, gpus), "counts": counts}


def _fabric_degraded(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    indices = targets(body, path, gpus)
    for i in indices:
        if gpus[i].model.fabric != "nvl":
            raise Invalid(
                s.key(path, "gpu"), f"gpu {i} ({gpus[i].model.key}) reports no fabric health"
            )
    health = s.choice(body.get("health", "unhealthy"), s.key(path, "health"), FABRIC_HEALTH)
    return {"gpus": indices, "health": health}


def _dcgm_restart(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    """The node's DCGM host engine dies and comes back after ``downtime`` (default at once)."""
    return {"downtime": parse_duration(body.get("downtime", 0), s.key(path, "downtime"))}


def _dcgm_profiling(body: Mapping[str, Any], path: str, gpus: Sequence[GpuSpec]) -> Params:
    """Another process (Nsight, a second engine) takes the GPU's profiling counters, or frees
    them: DCGM watches then fail with IN_USE and watched fields read blank."""
    state = s.choice(body.get("state", "in_use"), s.key(path, "state"), ("in_use", "free"))
    return {"gpus": targets(body, path, gpus), "state": state}


def _type(keys: set[str], required: set[str], validate: Validator) -> EventType:
    return EventType(frozenset(keys), frozenset(required), validate)


_GPU = {"gpu"}
EVENT_TYPES: Mapping[str, EventType] = {
    "xid": _type(
        {"gpu", "code", "pid", "process_name", "delivery", "message", "mig"}, {"gpu", "code"}, _xid
    ),
    "sxid": _type({"switch", "code", "severity", "link", "message"}, {"switch", "code"}, _sxid),
    "gpu_lost": _type(_GPU, _GPU, _gpus_only),
    "gpu_recovered": _type(_GPU, _GPU, _gpus_only),
    "throttle": _type({"gpu", "reason", "state", "duration"}, {"gpu", "reason"}, _throttle),
    "ecc": _type({"gpu", "corrected", "uncorrected"}, _GPU, _ecc),
    "row_remap": _type({"gpu", "cause", "rows"}, _GPU, _row_remap),
    "row_remap_failure": _type(_GPU, _GPU, _row_remap_failure),
    "retired_pages": _type({"gpu", "cause", "count", "pending"}, _GPU, _retired_pages),
    "recovery_action": _type({"gpu", "action"}, {"gpu", "action"}, _recovery_action),
    "field_value": _type(
        {"gpu", "field", "value", "value_type", "state"}, {"gpu", "field"}, _field_value
    ),
    "mig_reconfigure": _type({"gpu", "mig"}, {"gpu", "mig"}, _mig_reconfigure),
    "allocate": _type({*ALLOCATION_KEYS, "workload"}, {"gpu", "pod"}, _allocate),
    "release": _type({"pod", "namespace", "gpu"}, {"pod"}, _release),
    "workload_start": _type(WORKLOAD_KEYS, {"gpu", "pid"}, _workload_start),
    "workload_stop": _type({"pid"}, {"pid"}, _workload_stop),
    "dcgm_restart": _type({"downtime"}, set(), _dcgm_restart),
    "dcgm_profiling": _type({"gpu", "state"}, _GPU, _dcgm_profiling),
    "hang": _type({"function", "gpu", "duration"}, set(), _hang),
    "unhang": _type({"function", "gpu"}, set(), _unhang),
    "nvlink_down": _type({"gpu", "link"}, _GPU, _nvlink_down),
    "nvlink_up": _type({"gpu", "link"}, _GPU, _nvlink_down),
    "nvlink_errors": _type(
        {"gpu", "link", *NVLINK_ERROR_TYPES, *NVLINK5_ERROR_TYPES}, _GPU, _nvlink_errors
    ),
    "pcie_downtrain": _type({"gpu", "width", "generation"}, _GPU, _pcie_downtrain),
    "pcie_errors": _type({"gpu", "replays", *PCIE_ERROR_TYPES}, _GPU, _pcie_errors),
    "fabric_degraded": _type({"gpu", "health"}, _GPU, _fabric_degraded),
    "gpu_missing_at_boot": _type(_GPU, _GPU, _gpus_only),
    "nvml_error": _type(
        {"function", "gpu", "error", "state", "every", "times"}, {"function"}, _nvml_error
    ),
}


# --------------------------------------------------------------------------- parsing events


def parse_event(raw: Any, path: str, gpus: Sequence[GpuSpec], *, timed: bool) -> EventSpec:
    """Validate one event; ``timed`` events (timeline entries) need ``at`` and may ``repeat``."""
    base = s.mapping(raw, path, set(raw) if isinstance(raw, Mapping) else set(), {"type"})
    kind = s.choice(base["type"], s.key(path, "type"), EVENT_TYPES)
    handler = EVENT_TYPES[kind]
    extra = {"at", "repeat"} if timed else set()
    body = s.mapping(base, path, {"type", *handler.keys, *extra}, {*handler.required})
    at = repeat = None
    if timed:
        if "at" not in body:
            raise Invalid(s.key(path, "at"), "required key is missing")
        at = parse_duration(body["at"], s.key(path, "at"))
        repeat = _repeat(body["repeat"], s.key(path, "repeat")) if "repeat" in body else None
    params = handler.validate(body, path, gpus)
    raw_copy = {k: v for k, v in body.items() if k not in extra}
    return EventSpec(kind, params, raw_copy, at, repeat)


def _repeat(raw: Any, path: str) -> float:
    if isinstance(raw, str) and raw.strip().startswith("every "):
        raw = raw.strip()[len("every ") :]
    period = parse_duration(raw, path)
    if period < MIN_REPEAT_S:
        # A shorter period (1 µs was accepted) kept the simulator spinning.
        raise Invalid(path, f"repeat period must be at least {MIN_REPEAT_S * 1000:g}ms")
    return period


def parse_events(data: Any, source: str, gpus: Sequence[GpuSpec]) -> list[EventSpec]:
    """Untimed events to inject: one mapping or a list of them."""
    items = data if isinstance(data, list) else [data]
    try:
        if not items:
            raise Invalid("", "no events given")
        paths = [s.item("", i) if isinstance(data, list) else "" for i in range(len(items))]
        return [parse_event(raw, p, gpus, timed=False) for raw, p in zip(items, paths, strict=True)]
    except Invalid as exc:
        raise exc.at(source) from None
