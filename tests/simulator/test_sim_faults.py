"""Errors behave like real hardware: NotSupported, GpuIsLost, Uninitialized, hangs."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from .sim_helpers import FakeClock, MakeNode

MIXED = """
gpus:
  - {model: A100-SXM-80GB}
  - {model: L40S}
  - {model: V100-SXM2-32GB}
  - {model: H100-SXM-80GB, mig: [3g.40gb, 3g.40gb]}
  - {model: H100-SXM-80GB}
  - {model: H100-SXM-80GB, mig: []}
workloads:
  - {gpu: 3, mig: 0, sm: 0.5}
"""


def handle(index: int) -> Any:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def test_gpm_is_hopper_only(make_node: MakeNode) -> None:
    make_node(MIXED)
    for index in (0, 1, 2):
        assert pynvml.nvmlGpmQueryDeviceSupport(handle(index)).isSupportedDevice == 0
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlGpmSampleGet(handle(index), pynvml.nvmlGpmSampleAlloc())
    assert pynvml.nvmlGpmQueryDeviceSupport(handle(4)).isSupportedDevice == 1


def test_mig_restrictions(make_node: MakeNode) -> None:
    make_node(MIXED)
    parent = handle(3)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(parent)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(parent)
    # MIG enabled but no instances: the remapper answers again.
    assert pynvml.nvmlDeviceGetRemappedRows(handle(5)) == (0, 0, 0, 0)
    for call in (
        pynvml.nvmlDeviceGetUtilizationRates,
        pynvml.nvmlDeviceGetPowerUsage,
        pynvml.nvmlDeviceGetTotalEnergyConsumption,
        pynvml.nvmlDeviceGetEccMode,
        lambda h: pynvml.nvmlDeviceGetTemperature(h, 0),
        lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        lambda h: pynvml.nvmlDeviceGetTotalEccErrors(h, 0, 0),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(mig)
    (field,) = pynvml.nvmlDeviceGetFieldValues(mig, [74])
    assert field.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(handle(1))


def test_memory_repair_by_generation(make_node: MakeNode) -> None:
    make_node(MIXED)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPages(handle(0), 1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle(4))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(handle(2))
    assert pynvml.nvmlDeviceGetRetiredPages(handle(2), 1) == []


def test_field_support_by_model(make_node: MakeNode) -> None:
    make_node(MIXED)
    l40s_memory_temp, l40s_power_cap = pynvml.nvmlDeviceGetFieldValues(handle(1), [82, 74])
    assert l40s_memory_temp.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert l40s_power_cap.nvmlReturn == pynvml.NVML_SUCCESS
    (v100_thermal,) = pynvml.nvmlDeviceGetFieldValues(handle(2), [269])
    assert v100_thermal.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def fields_on(make_node: MakeNode, driver: str, ids: list[int]) -> dict[int, Any]:
    make_node(f'node: {{driver_version: "{driver}"}}\ngpus: [H100-SXM-80GB]')
    return {int(v.fieldId): v for v in pynvml.nvmlDeviceGetFieldValues(handle(0), ids)}


COUNTER_IDS = [74, 76, 251, 252, 253, 269, 270, 271]


@pytest.mark.parametrize(
    ("driver", "counters"),
    [
        ("575.57.08", [74, 76, 251, 252, 253]),  # nvidia-ml-py 12.575.51
        ("580.65.06", [74, 76, 251, 252, 253]),  # 13.580.65
        ("580.95.05", [74, 76, 269, 270, 271]),  # 13.580.82 and later
        ("570.172.08", [74, 76]),  # 12.570.86: no thermal/brake counters at all
    ],
)
def test_the_clock_event_counters_sit_where_the_drivers_header_puts_them(
    make_node: MakeNode, driver: str, counters: list[int]
) -> None:
    fields = fields_on(make_node, driver, COUNTER_IDS)
    answered = [fid for fid, v in fields.items() if v.nvmlReturn == pynvml.NVML_SUCCESS]
    assert answered == counters, f"driver {driver} answers counters at {answered}"
    for fid in counters:
        assert fields[fid].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG


def test_ids_a_drivers_header_does_not_define_answer_invalid_argument(
    make_node: MakeNode,
) -> None:
    # 570's NVML_FI_MAX is 269: 269-271 are unknown ids there, 251-253 power smoothing (which
    # an H100 lacks); 230 (recovery action) arrived with 570 and is beyond 560's NVML_FI_MAX.
    fields = fields_on(make_node, "570.172.08", [230, 251, 269])
    assert fields[230].nvmlReturn == pynvml.NVML_SUCCESS
    assert fields[251].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert fields[269].nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT


@pytest.mark.parametrize("driver", ["535.183.01", "560.35.03"])
def test_recovery_action_field_needs_a_570_driver(make_node: MakeNode, driver: str) -> None:
    (field,) = fields_on(make_node, driver, [230]).values()
    assert field.nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_an_injected_field_value_replaces_the_answer_until_switched_off(
    make_node: MakeNode,
) -> None:
    node = make_node("gpus: [H100-SXM-80GB]")
    node.inject({"type": "field_value", "gpu": 0, "field": 270, "value": 42, "value_type": 1})
    (field,) = pynvml.nvmlDeviceGetFieldValues(handle(0), [270])
    assert (field.valueType, field.value.uiVal) == (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 42)
    node.inject({"type": "field_value", "gpu": 0, "field": 270, "state": "off"})
    (field,) = pynvml.nvmlDeviceGetFieldValues(handle(0), [270])
    assert field.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert node.field_requests[270] == 2


def test_ecc_disabled_means_no_counters(make_node: MakeNode) -> None:
    make_node("""
        gpus: [{model: L40S, ecc: false}]
        """)
    assert pynvml.nvmlDeviceGetEccMode(handle(0)) == [0, 0]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTotalEccErrors(handle(0), 1, 1)


def test_lost_gpu_and_reset(make_node: MakeNode, clock: FakeClock) -> None:
    node = make_node("""
        gpus:
          - {model: H100-SXM-80GB, count: 2}
          - {model: H100-SXM-80GB, mig: [7g.80gb]}
        timeline:
          - {at: 10s, type: ecc, gpu: 0, corrected: 3, uncorrected: 1}
          - {at: 10s, type: row_remap, gpu: 0, cause: uncorrectable}
          - {at: 20s, type: gpu_lost, gpu: [0, 2]}
          - {at: 30s, type: gpu_recovered, gpu: 0}
        """)
    early, mig = handle(0), pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(2), 0)
    clock.advance(20)
    calls: list[Callable[[], Any]] = [
        lambda: pynvml.nvmlDeviceGetHandleByIndex(0),
        lambda: pynvml.nvmlDeviceGetUUID(early),
        lambda: pynvml.nvmlDeviceGetPowerUsage(early),
        lambda: pynvml.nvmlDeviceGetMemoryInfo(mig),
    ]
    for call in calls:
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()
    assert pynvml.nvmlDeviceGetPowerUsage(handle(1)) > 0
    clock.advance(10)
    recovered = handle(0)
    assert pynvml.nvmlDeviceGetTotalEccErrors(recovered, 0, 0) == 0
    assert pynvml.nvmlDeviceGetTotalEccErrors(recovered, 0, 1) == 3
    assert pynvml.nvmlDeviceGetRemappedRows(recovered) == (0, 1, 0, 0)
    assert node.gpus[2].lost


def test_calls_before_init_are_uninitialized(make_node: MakeNode) -> None:
    node = make_node(MIXED, init=False)
    assert node.library.nvmlDeviceGetCount_v2(None) == pynvml.NVML_ERROR_UNINITIALIZED
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 6
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_fake_functions_never_raise(make_node: MakeNode) -> None:
    node = make_node(MIXED)
    assert (
        node.library.nvmlDeviceGetPowerUsage(object(), None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    )
    assert node.library.nvmlDeviceGetCount_v2(None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert node.library.nvmlDeviceGetCount_v2(object()) == pynvml.NVML_ERROR_UNKNOWN


def test_hang_blocks_one_function_on_one_gpu_for_its_duration(make_node: MakeNode) -> None:
    node = make_node(MIXED)
    node.inject({"type": "hang", "function": "nvmlDeviceGetPowerUsage", "gpu": 4, "duration": 0.3})
    started = time.monotonic()
    assert pynvml.nvmlDeviceGetPowerUsage(handle(0)) > 0
    assert time.monotonic() - started < 0.2
    pynvml.nvmlDeviceGetPowerUsage(handle(4))
    assert time.monotonic() - started >= 0.29
    started = time.monotonic()
    pynvml.nvmlDeviceGetPowerUsage(handle(4))
    assert time.monotonic() - started < 0.2


def test_close_releases_a_hang(make_node: MakeNode) -> None:
    node = make_node(MIXED)
    node.inject({"type": "hang", "function": "nvmlDeviceGetCount_v2"})
    finished = threading.Event()

    def call() -> None:
        pynvml.nvmlDeviceGetCount()
        finished.set()

    threading.Thread(target=call, daemon=True).start()
    assert not finished.wait(0.1)
    node.close()
    assert finished.wait(5)


def power_outcomes(gpu: int, calls: int) -> list[str]:
    """What ``calls`` successive power reads on ``gpu`` return: "ok" or the error's class name."""
    outcomes = []
    for _ in range(calls):
        try:
            pynvml.nvmlDeviceGetPowerUsage(handle(gpu))
            outcomes.append("ok")
        except pynvml.NVMLError as exc:
            outcomes.append(type(exc).__name__)
    return outcomes


def test_an_intermittent_error_fails_every_nth_call_on_its_gpu_only(make_node: MakeNode) -> None:
    node = make_node(MIXED)
    node.inject({"type": "nvml_error", "function": "nvmlDeviceGetPowerUsage", "gpu": 1, "every": 3})
    unknown = "NVMLError_Unknown"
    assert power_outcomes(1, 6) == ["ok", "ok", unknown, "ok", "ok", unknown]
    assert power_outcomes(0, 3) == ["ok", "ok", "ok"], "another GPU must not see the failure"


def test_a_counted_gpu_is_lost_error_switches_itself_off(make_node: MakeNode) -> None:
    node = make_node(MIXED)
    node.inject(
        {
            "type": "nvml_error",
            "function": "nvmlDeviceGetPowerUsage",
            "gpu": 1,
            "error": "gpu_is_lost",
            "times": 2,
        }
    )
    assert power_outcomes(1, 4) == ["NVMLError_GpuIsLost"] * 2 + ["ok"] * 2
    assert pynvml.nvmlDeviceGetTemperature(handle(1), 0) > 0, "other functions still answer"
    assert not node.failures, "a spent injection is removed"


def test_a_wrong_memory_v2_struct_version_answers_function_not_found(make_node: MakeNode) -> None:
    make_node("gpus: [H100-SXM-80GB]")
    memory = pynvml.c_nvmlMemory_v2_t()
    memory.version = pynvml.nvmlMemory_v2 + 1
    function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2")
    code = function(handle(0), ctypes.byref(memory))
    assert code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, "as real drivers answered, not 25"


def test_max_mig_device_count_is_zero_while_mig_is_off(make_node: MakeNode) -> None:
    make_node("gpus: [A100-SXM-80GB, {model: A100-SXM-80GB, mig: []}]")
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(0)) == 0
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(1)) == 7


def test_a_lost_gpu_keeps_failing_event_waits_until_the_set_is_freed(make_node: MakeNode) -> None:
    node = make_node("gpus: [H100-SXM-80GB, H100-SXM-80GB]")
    event_set = pynvml.nvmlEventSetCreate()
    for index in (0, 1):
        pynvml.nvmlDeviceRegisterEvents(handle(index), 0x8, event_set)
    node.inject({"type": "gpu_lost", "gpu": 1})
    for _ in range(3):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlEventSetWait_v2(event_set, 0)
    pynvml.nvmlEventSetFree(event_set)
    fresh = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(handle(0), 0x8, fresh)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(fresh, 0)  # a set without the lost GPU waits normally
