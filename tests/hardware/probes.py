"""Raw NVML answers only a real GPU can settle, for the interconnect signals (issue 13).

What the exporter assumes and this prints, per GPU: the NVLink link count (field 91) and each
link's state; whether the NVLink throughput fields (138/139) accept scope UINT_MAX as "all links"
and whether that equals the sum of the per-link values; the DL error totals (38-59, 160) and the
NVLink5 per-link counters (208-221) with their return codes and value types; the PCIe counters
(94, 169, 173-183, 197/198) twice, 2 s apart, to see they are monotonic; the fabric info (v3, then
v1); the engine utilisation calls; the temperature thresholds. Run by check.py; with
``--simulate`` against the simulator check.py installs in its own process (so the script
itself is tested).
"""

from __future__ import annotations

import time
from typing import Any

import pynvml

ALL_LINKS = 0xFFFFFFFF
TOTAL_FIELDS = (38, 45, 52, 59, 160)
NVLINK5_FIELDS = (208, 214, 215, 219, 221)
PCIE_FIELDS = (94, 95, 169, *range(173, 184), 197, 198)


def _fields(handle: Any, keys: list[tuple[int, int]]) -> list[dict[str, Any]]:
    try:
        values = pynvml.nvmlDeviceGetFieldValues(handle, keys)
    except pynvml.NVMLError as exc:
        return [{"field": keys, "error": str(exc)}]
    answers = []
    for (field, scope), value in zip(keys, values, strict=True):
        entry: dict[str, Any] = {"field": field, "scope": scope, "return": int(value.nvmlReturn)}
        if int(value.nvmlReturn) == pynvml.NVML_SUCCESS:
            entry["value_type"] = int(value.valueType)
            entry["value"] = int(value.value.ullVal)
        answers.append(entry)
    return answers


def _call(fn: Any, *args: Any) -> Any:
    try:
        result = fn(*args)
    except pynvml.NVMLError as exc:
        return f"error: {exc}"
    return result if isinstance(result, int | str | list) else str(result)


def _fabric(handle: Any) -> dict[str, Any]:
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    answer = _call(pynvml.nvmlDeviceGetGpuFabricInfoV, handle, info)
    if answer == pynvml.NVML_SUCCESS:
        return {
            "v3": {
                "cluster_uuid": bytes(info.clusterUuid).hex(),
                "clique_id": int(info.cliqueId),
                "state": int(info.state),
                "status": int(info.status),
                "health_mask": int(info.healthMask),
                "health_summary": int(info.healthSummary),
            }
        }
    legacy = pynvml.c_nvmlGpuFabricInfo_t()
    return {"v3": answer, "v1": _call(pynvml.nvmlDeviceGetGpuFabricInfo, handle, legacy)}


def probe_gpu(handle: Any) -> dict[str, Any]:
    result: dict[str, Any] = {"link_count": _fields(handle, [(91, 0)])}
    links = result["link_count"][0].get("value", 0)
    result["link_state"] = [_call(pynvml.nvmlDeviceGetNvLinkState, handle, i) for i in range(links)]
    per_link = [(f, i) for f in (138, 139) for i in range(links)]
    result["throughput_all_links"] = _fields(handle, [(138, ALL_LINKS), (139, ALL_LINKS)])
    answered = [a.get("value", 0) for a in _fields(handle, per_link) if a.get("field") == 138]
    result["throughput_tx_sum_of_links"] = sum(answered)
    result["nvlink_totals"] = _fields(handle, [(f, 0) for f in TOTAL_FIELDS])
    result["nvlink5_link0"] = _fields(handle, [(f, 0) for f in NVLINK5_FIELDS])
    result["dl_error_counter_link0"] = (
        _call(pynvml.nvmlDeviceGetNvLinkErrorCounter, handle, 0, 0) if links else "no links"
    )
    result["pcie_counters"] = {"first": _fields(handle, [(f, 0) for f in PCIE_FIELDS])}
    result["pcie_link"] = {
        fn.__name__: _call(fn, handle)
        for fn in (
            pynvml.nvmlDeviceGetCurrPcieLinkGeneration,
            pynvml.nvmlDeviceGetMaxPcieLinkGeneration,
            pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration,
            pynvml.nvmlDeviceGetCurrPcieLinkWidth,
            pynvml.nvmlDeviceGetMaxPcieLinkWidth,
        )
    }
    result["fabric"] = _fabric(handle)
    result["engines"] = {
        fn.__name__: _call(fn, handle)
        for fn in (
            pynvml.nvmlDeviceGetEncoderUtilization,
            pynvml.nvmlDeviceGetDecoderUtilization,
            pynvml.nvmlDeviceGetJpgUtilization,
            pynvml.nvmlDeviceGetOfaUtilization,
        )
    }
    result["thresholds"] = {
        name: _call(pynvml.nvmlDeviceGetTemperatureThreshold, handle, value)
        for name, value in (("shutdown", 0), ("slowdown", 1), ("memory_max", 2), ("gpu_max", 3))
    }
    return result


def interconnect_probes(gpus: int) -> dict[str, Any]:
    """Every GPU's raw answers (NVML already initialised by the caller: check.py's open_nvml)."""
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
    answers = {str(i): probe_gpu(handle) for i, handle in enumerate(handles)}
    time.sleep(2)  # the PCIe counters again: they must only go up
    for i, handle in enumerate(handles):
        later = _fields(handle, [(f, 0) for f in PCIE_FIELDS])
        answers[str(i)]["pcie_counters"]["2s_later"] = later
    return answers
