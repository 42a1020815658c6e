"""What only a real driver settles, asked of NVML directly (not through the exporter).

For each GPU: the clock-event counter fields with their return code and value type (their ids
moved between driver builds, data/clock_event_fields.tsv), the supported and current clock-event
masks (HwSlowdown's nesting), GPM's answer to one sample, to samples under 100 ms apart and to
reversed samples, memory v2's ``total == reserved + used + free``, and on MIG GPUs the GPU-instance
path against the unprivileged attribute path (docs/hardware-validation.md says what to record).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pynvml

FIELDS = (74, 76, 230, 251, 252, 253, 269, 270, 271)
REASON_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


def answer(call: Any, *args: Any) -> tuple[str, Any]:
    """("ok", value) or (error name, None): every NVML error is a finding here, not a failure."""
    try:
        return "ok", call(*args)
    except pynvml.NVMLError as exc:
        return f"{type(exc).__name__} ({exc.value})", None
    except Exception as exc:  # a versioned symbol pynvml cannot find is a plain Exception
        return f"{type(exc).__name__}: {exc}", None


def reasons(mask: int) -> str:
    names = [name for bit, name in REASON_BITS.items() if mask & bit]
    return f"{mask:#x} ({', '.join(names) or 'none'})"


def fields(handle: Any) -> dict[str, str]:
    status, values = answer(pynvml.nvmlDeviceGetFieldValues, handle, list(FIELDS))
    if values is None:
        return {"all": status}
    found = {}
    for value in values:
        code = int(value.nvmlReturn)
        if code != pynvml.NVML_SUCCESS:
            found[str(value.fieldId)] = f"return {code} ({pynvml.nvmlErrorString(code)})"
            continue
        member = VALUE_MEMBERS.get(int(value.valueType), "ullVal")
        number = getattr(value.value, member)
        found[str(value.fieldId)] = f"valueType {int(value.valueType)} ({member}) = {number}"
    return found


def gpm(handle: Any, sleep: Any = time.sleep) -> dict[str, str]:
    """Metric 2 (SM_UTIL) from one sample, samples 50 ms apart, 200 ms apart, and reversed."""
    status, support = answer(pynvml.nvmlGpmQueryDeviceSupport, handle)
    if support is None or not support.isSupportedDevice:
        return {"support": status if support is None else "not a GPM device"}
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    try:
        pynvml.nvmlGpmSampleGet(handle, first)
        result = {"one sample": _metric(first, first)}
        sleep(0.05)
        pynvml.nvmlGpmSampleGet(handle, second)
        result["50 ms apart"] = _metric(first, second)
        sleep(0.2)
        pynvml.nvmlGpmSampleGet(handle, second)
        result["250 ms apart"] = _metric(first, second)
        result["reversed"] = _metric(second, first)
        return result
    finally:
        pynvml.nvmlGpmSampleFree(first)
        pynvml.nvmlGpmSampleFree(second)


def _metric(first: Any, second: Any) -> str:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    status, _ = answer(pynvml.nvmlGpmMetricsGet, request)
    if status != "ok":
        return status
    metric = request.metrics[0]
    return f"return {int(metric.nvmlReturn)}, SM_UTIL {float(metric.value):.3f}%"


def memory(handle: Any) -> str:
    status, info = answer(pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
    if info is None:
        return f"v2: {status}"
    parts = info.reserved + info.used + info.free
    verdict = "holds" if parts == info.total else f"differs by {info.total - parts}"
    return (
        f"v2 total {info.total} reserved {info.reserved} used {info.used} free {info.free}: "
        f"total == reserved + used + free {verdict}"
    )


def mig(handle: Any) -> dict[str, str]:
    result: dict[str, str] = {}
    status, mode = answer(pynvml.nvmlDeviceGetMigMode, handle)
    result["mode"] = status if mode is None else f"current {mode[0]}, pending {mode[1]}"
    status, count = answer(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle)
    result["max_mig_device_count"] = status if count is None else str(count)
    status, rows = answer(pynvml.nvmlDeviceGetRemappedRows, handle)
    result["remapped_rows"] = status if rows is None else str(rows)
    result["gpu_instance_profiles"] = _profiles(handle)
    if mode is None or not mode[0]:
        return result
    for slot in range(int(count or 0)):
        status, mig_handle = answer(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig_handle is None:
            continue
        result[f"mig{slot}"] = _mig_instance(handle, mig_handle)
    return result


def _profiles(handle: Any) -> str:
    """Every GPU-instance profile id's answer (nvml.h: NotSupported while MIG is off), with the
    catalog's memory for the model (data/mig_profiles.tsv rows marked estimate) beside it."""
    from gpu_exporter.migprofiles import catalog_table, profile_name

    model = _text(pynvml.nvmlDeviceGetName(handle))
    table = catalog_table(model)
    catalog = {p.name: p.memory_mib for p in table.profiles} if table else {}
    answers: list[str] = []
    refused: dict[str, list[int]] = {}
    for profile_id in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        status, info = answer(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile_id)
        if info is None:
            refused.setdefault(status, []).append(profile_id)
            continue
        name = profile_name(info)
        answers.append(
            f"{profile_id}: {name} {info.sliceCount} slices {info.memorySizeMB} MiB "
            f"(catalog {catalog.get(name, 'absent')})"
        )
    answers += [f"ids {ids}: {status}" for status, ids in refused.items()]
    return "; ".join(answers)


def _mig_instance(parent: Any, handle: Any) -> str:
    """The privileged GPU-instance path and the unprivileged attribute path, side by side."""
    from gpu_exporter.migprofiles import profile_from_attributes
    from gpu_exporter.nvml import DeviceCalls, ErrorCounter, SupportRegistry

    gi = pynvml.nvmlDeviceGetGpuInstanceId(handle)
    by_id, instance = answer(pynvml.nvmlDeviceGetGpuInstanceById, parent, gi)
    privileged_name = by_id
    if instance is not None:
        info = pynvml.nvmlGpuInstanceGetInfo(instance)
        profile = pynvml.nvmlDeviceGetGpuInstanceProfileInfoById(parent, info.profileId)
        privileged_name = repr(_text(profile.name))
    status, attrs = answer(pynvml.nvmlDeviceGetAttributes, handle)
    size = f" ({attrs.gpuInstanceSliceCount} slices, {attrs.memorySizeMB} MB)" if attrs else ""
    calls = DeviceCalls("check", SupportRegistry(), ErrorCounter(), collector="check")
    named = profile_from_attributes(parent, handle, calls)
    return (
        f"gi {gi}: by GPU instance {privileged_name}; attributes {status}{size}; "
        f"name matched from attributes {named!r}"
    )


def facts(handle_count: int) -> dict[str, Any]:
    """Everything above for each GPU, with the driver and the caller's UID."""
    result: dict[str, Any] = {
        "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
        "nvml_version": _text(pynvml.nvmlSystemGetNVMLVersion()),
        "euid": os.geteuid(),
        "gpus": {},
    }
    for index in range(handle_count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        supported = answer(pynvml.nvmlDeviceGetSupportedClocksEventReasons, handle)[1]
        result["gpus"][str(index)] = {
            "name": _text(pynvml.nvmlDeviceGetName(handle)),
            "fields": fields(handle),
            "supported_reasons": reasons(int(supported)) if supported is not None else "n/a",
            "gpm": gpm(handle),
            "memory": memory(handle),
            "mig": mig(handle),
        }
    return result


def current_reasons(handle_count: int) -> dict[str, str]:
    """The current clock-event mask per GPU (sampled during the load phase)."""
    found = {}
    for index in range(handle_count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        status, mask = answer(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
        found[str(index)] = status if mask is None else reasons(int(mask))
    return found


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def show(title: str, data: Any, indent: int = 0) -> None:
    """Print nested facts as an indented outline."""
    pad = "  " * indent
    if not isinstance(data, dict):
        print(f"{pad}{title}: {data}")
        return
    print(f"{pad}{title}:")
    for key, value in data.items():
        show(str(key), value, indent + 1)
