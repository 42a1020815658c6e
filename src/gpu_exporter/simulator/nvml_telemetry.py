"""Fake NVML: memory, utilisation, power, thermal, clocks, fields, memory errors, processes."""

from __future__ import annotations

import time
from typing import Any

import pynvml

from gpu_exporter.simulator.devices import GpuDevice, MigDevice, remap_histogram
from gpu_exporter.simulator.errors import NvmlFailure
from gpu_exporter.simulator.links import INTERCONNECT_FIELDS, field_value
from gpu_exporter.simulator.nvml_base import (
    ARGUMENT_VERSION_MISMATCH,
    FUNCTION_NOT_FOUND,
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    FunctionsBase,
    out,
    val,
)
from gpu_exporter.simulator.nvml_interconnect import engine_utilization

# NVML averages utilisation over its last sample period (1/6 s .. 1 s); one second here.
UTILIZATION_WINDOW_S = 1.0
VIDEO_CLOCK_MHZ = 1755
# Clock-event counter fields (nanoseconds) and the reasons they count, by the newest header's ids
# (the driver's own ids are translated first: see data/drivers.yaml).
COUNTER_FIELDS = {
    74: ("sw_power_cap",),
    75: ("sw_thermal_slowdown", "hw_thermal_slowdown"),
    76: ("sync_boost",),
    77: (),
    78: ("gpu_idle",),
    79: (),
    269: ("sw_thermal_slowdown",),
    270: ("hw_thermal_slowdown",),
    271: ("hw_power_brake_slowdown",),
}
# Power-smoothing fields (Blackwell; answered only by models that list them): plausible settings
# as unsigned ints (value type unverified): enabled, privilege level, immediate ramp-down,
# active preset profile, admin override %TMP floor, admin override ramp-up rate (mW/s).
POWER_SMOOTHING_VALUES = {251: 1, 252: 0, 253: 0, 264: 0, 265: 0, 266: 5_000_000}
MEMORY_TEMP_FIELD = 82
TOTAL_ENERGY_FIELD = 83
# NVML_FI_DEV_ECC_CURRENT and the single/double-bit volatile/aggregate totals.
ECC_CURRENT_FIELD = 1
ECC_FIELDS = frozenset({ECC_CURRENT_FIELD, 3, 4, 5, 6})
RECOVERY_ACTION_FIELD = 230
# Supported clock-event reasons: every bit but "display clock setting" on headless parts.
SUPPORTED_REASONS = 0xFF
SUPPORTED_REASONS_WITH_DISPLAY = 0x1FF


class TelemetryFunctions(FunctionsBase):
    # ------------------------------------------------------------------ memory

    def _memory(self, handle: Any) -> tuple[int, int, int]:
        """(total, reserved, used) in bytes, for a GPU or a MIG instance."""
        device = self.device(handle)
        if isinstance(device, MigDevice):
            return device.memory_total, 0, device.memory_used()
        self.privileged_parent(device)
        return device.memory_total, device.memory_reserved, device.memory_used()

    def nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> int:
        total, reserved, used = self._memory(handle)
        result = out(memory)
        # v1 has no "reserved": it counts as used.
        result.total, result.used = total, used + reserved
        result.free = total - used - reserved
        return SUCCESS

    def nvmlDeviceGetMemoryInfo_v2(self, handle: Any, memory: Any) -> int:
        total, reserved, used = self._memory(handle)
        result = out(memory)
        if result.version != pynvml.nvmlMemory_v2:
            # What real drivers answered for a wrong nvmlMemory_v2 version (issue 21's audit of
            # released drivers; not ArgumentVersionMismatch, which other versioned calls use).
            raise NvmlFailure(FUNCTION_NOT_FOUND)
        result.total, result.reserved, result.used = total, reserved, used
        result.free = total - reserved - used
        return SUCCESS

    # ------------------------------------------------------------------ utilisation

    def nvmlDeviceGetUtilizationRates(self, handle: Any, utilization: Any) -> int:
        gpu = self.gpu(handle)
        if gpu.mig_enabled:
            raise NvmlFailure(NOT_SUPPORTED)
        t = self.now()
        start = t - UTILIZATION_WINDOW_S
        result = out(utilization)
        result.gpu = round(100 * gpu.mean("util", start, t))
        result.memory = round(100 * gpu.mean("dram", start, t))
        return SUCCESS

    def nvmlDeviceGetEncoderUtilization(self, handle: Any, value: Any, period: Any) -> int:
        return engine_utilization(self.gpu(handle), "encoder", value, period)

    def nvmlDeviceGetDecoderUtilization(self, handle: Any, value: Any, period: Any) -> int:
        return engine_utilization(self.gpu(handle), "decoder", value, period)

    # ------------------------------------------------------------------ power and thermal

    def nvmlDeviceGetPowerUsage(self, handle: Any, power: Any) -> int:
        out(power).value = round(1000 * self.gpu(handle).power_w(self.now()))
        return SUCCESS

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, limit: Any) -> int:
        out(limit).value = round(1000 * self.gpu(handle).model.power_limit_w)
        return SUCCESS

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any, limit: Any) -> int:
        return self.nvmlDeviceGetEnforcedPowerLimit(handle, limit)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, energy: Any) -> int:
        gpu = self.gpu(handle)
        self.node.advance(gpu=gpu)
        out(energy).value = int(1000 * gpu.energy_j)
        return SUCCESS

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, temperature: Any) -> int:
        gpu = self.gpu(handle)
        if int(val(sensor)) != pynvml.NVML_TEMPERATURE_GPU:
            raise NvmlFailure(INVALID_ARGUMENT)
        out(temperature).value = gpu.temperature_c(self.now())
        return SUCCESS

    def nvmlDeviceGetTemperatureV(self, handle: Any, temperature: Any) -> int:
        gpu = self.gpu(handle)
        result = out(temperature)
        if result.version != pynvml.nvmlTemperature_v1:
            raise NvmlFailure(ARGUMENT_VERSION_MISMATCH)
        if int(val(result.sensorType)) != pynvml.NVML_TEMPERATURE_GPU:
            raise NvmlFailure(INVALID_ARGUMENT)
        result.temperature = gpu.temperature_c(self.now())
        return SUCCESS

    # ------------------------------------------------------------------ clocks

    def _clock(self, gpu: GpuDevice, kind: int, maximum: bool) -> int:
        if kind in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
            return gpu.model.max_sm_clock_mhz if maximum else gpu.sm_clock_mhz(self.now())
        if kind == pynvml.NVML_CLOCK_MEM:
            return gpu.model.max_mem_clock_mhz
        if kind == pynvml.NVML_CLOCK_VIDEO:
            return VIDEO_CLOCK_MHZ
        raise NvmlFailure(INVALID_ARGUMENT)

    def nvmlDeviceGetClockInfo(self, handle: Any, kind: Any, clock: Any) -> int:
        out(clock).value = self._clock(self.gpu(handle), int(val(kind)), maximum=False)
        return SUCCESS

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, kind: Any, clock: Any) -> int:
        out(clock).value = self._clock(self.gpu(handle), int(val(kind)), maximum=True)
        return SUCCESS

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, reasons: Any) -> int:
        out(reasons).value = self.gpu(handle).reasons_mask(self.now())
        return SUCCESS

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any, reasons: Any) -> int:
        gpu = self.gpu(handle)
        display = gpu.model.architecture == pynvml.NVML_DEVICE_ARCH_ADA
        out(reasons).value = SUPPORTED_REASONS_WITH_DISPLAY if display else SUPPORTED_REASONS
        return SUCCESS

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any, reasons: Any) -> int:
        return self.nvmlDeviceGetCurrentClocksEventReasons(handle, reasons)

    def nvmlDeviceGetSupportedClocksThrottleReasons(self, handle: Any, reasons: Any) -> int:
        return self.nvmlDeviceGetSupportedClocksEventReasons(handle, reasons)

    # ------------------------------------------------------------------ field values

    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values: Any) -> int:
        device = self.device(handle)
        self.node.advance(gpu=device.gpu)
        array = out(values)
        stamp = int(time.time() * 1_000_000)
        for i in range(int(val(count))):
            field = array[i]
            field.timestamp, field.latencyUsec = stamp, 0
            self.node.field_requests[int(field.fieldId)] += 1
            if isinstance(device, MigDevice):
                field.nvmlReturn = NOT_SUPPORTED
            else:
                self._field(device, field)
        return SUCCESS

    def _field(self, gpu: GpuDevice, field: Any) -> None:
        """One field as this driver numbers it (``data/drivers.yaml``), then as the model has it."""
        asked = int(field.fieldId)
        fid = self.node.field_layout.canonical(asked)
        field.nvmlReturn = SUCCESS
        if fid is None:
            field.nvmlReturn = INVALID_ARGUMENT  # an id this driver's header does not define
        elif fid not in gpu.model.field_ids and fid != RECOVERY_ACTION_FIELD:
            field.nvmlReturn = NOT_SUPPORTED
        elif fid in COUNTER_FIELDS:
            seconds = sum(gpu.reason_seconds.get(r, 0.0) for r in COUNTER_FIELDS[fid])
            _set(field, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, int(seconds * 1e9))
        elif fid == MEMORY_TEMP_FIELD:
            _set(field, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, gpu.temperature_c(self.now()) + 6)
        elif fid in ECC_FIELDS:
            if fid != ECC_CURRENT_FIELD and not gpu.spec.ecc:
                field.nvmlReturn = NOT_SUPPORTED  # as nvmlDeviceGetTotalEccErrors with ECC off
                return
            errors = gpu.errors
            counters = {
                ECC_CURRENT_FIELD: int(gpu.spec.ecc),
                3: errors.ecc_volatile["corrected"],
                4: errors.ecc_volatile["uncorrected"],
                5: errors.ecc_aggregate["corrected"],
                6: errors.ecc_aggregate["uncorrected"],
            }
            _set(field, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, counters[fid])
        elif fid == TOTAL_ENERGY_FIELD:
            _set(field, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, int(1000 * gpu.energy_j))
        elif fid in INTERCONNECT_FIELDS:
            try:
                value = field_value(gpu.links, fid, int(field.scopeId))
            except LookupError:  # a per-link field whose scope names no link
                field.nvmlReturn = INVALID_ARGUMENT
                return
            _set(field, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, value or 0)
        elif fid == RECOVERY_ACTION_FIELD:
            _set(field, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, gpu.recovery_action)
        elif fid in POWER_SMOOTHING_VALUES:
            _set(field, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, POWER_SMOOTHING_VALUES[fid])
        else:
            field.nvmlReturn = NOT_SUPPORTED
        override = gpu.field_overrides.get(asked)
        if override is not None and field.nvmlReturn == SUCCESS:
            _set(field, override[1], override[0])

    # ------------------------------------------------------------------ ECC and memory repair

    def _ecc_gpu(self, handle: Any) -> GpuDevice:
        gpu = self.gpu(handle)
        if not gpu.spec.ecc:
            raise NvmlFailure(NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetEccMode(self, handle: Any, current: Any, pending: Any) -> int:
        enabled = int(self.gpu(handle).spec.ecc)
        out(current).value, out(pending).value = enabled, enabled
        return SUCCESS

    def nvmlDeviceGetTotalEccErrors(
        self, handle: Any, error_type: Any, counter_type: Any, count: Any
    ) -> int:
        errors = self._ecc_gpu(handle).errors
        kind = {0: "corrected", 1: "uncorrected"}.get(int(val(error_type)))
        counters = {0: errors.ecc_volatile, 1: errors.ecc_aggregate}.get(int(val(counter_type)))
        if kind is None or counters is None:
            raise NvmlFailure(INVALID_ARGUMENT)
        out(count).value = counters[kind]
        return SUCCESS

    def _remapper(self, handle: Any) -> GpuDevice:
        gpu = self.gpu(handle)
        # Pre-Ampere has no remapper; MIG-enabled GPUs with instances do not report it.
        if not gpu.model.row_remapping or gpu.migs:
            raise NvmlFailure(NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetRemappedRows(
        self, handle: Any, corr: Any, unc: Any, pending: Any, failure: Any
    ) -> int:
        errors = self._remapper(handle).errors
        out(corr).value = errors.remapped["correctable"]
        out(unc).value = errors.remapped["uncorrectable"]
        out(pending).value = int(errors.remap_pending)
        out(failure).value = int(errors.remap_failure)
        return SUCCESS

    def nvmlDeviceGetRowRemapperHistogram(self, handle: Any, values: Any) -> int:
        errors = self._remapper(handle).errors
        histogram = remap_histogram(sum(errors.remapped.values()))
        result = out(values)
        result.max, result.high, result.partial, result.low, result.none = histogram
        return SUCCESS

    def _retired(self, handle: Any, cause: Any) -> list[tuple[str, int, bool]]:
        gpu = self.gpu(handle)
        if not gpu.model.page_retirement:
            raise NvmlFailure(NOT_SUPPORTED)
        wanted = {0: "single_bit", 1: "double_bit"}.get(int(val(cause)))
        if wanted is None:
            raise NvmlFailure(INVALID_ARGUMENT)
        return [page for page in gpu.errors.retired if page[0] == wanted]

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: Any, count: Any, pages: Any) -> int:
        retired = self._retired(handle, cause)
        if not _fits(count, pages, len(retired)):
            return INSUFFICIENT_SIZE
        for i, (_, address, _) in enumerate(retired):
            pages[i] = address
        return SUCCESS

    def nvmlDeviceGetRetiredPages_v2(
        self, handle: Any, cause: Any, count: Any, pages: Any, times: Any = None
    ) -> int:
        result = self.nvmlDeviceGetRetiredPages(handle, cause, count, pages)
        if result == SUCCESS and times is not None:
            for i in range(int(out(count).value)):
                times[i] = 0
        return result

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any, pending: Any) -> int:
        gpu = self.gpu(handle)
        if not gpu.model.page_retirement:
            raise NvmlFailure(NOT_SUPPORTED)
        out(pending).value = int(any(p for _, _, p in gpu.errors.retired))
        return SUCCESS


def _set(field: Any, value_type: int, value: int) -> None:
    """Fill a field's value union the way NVML does: ``valueType`` names the member."""
    field.valueType = value_type
    member = _MEMBERS[value_type]
    setattr(field.value, member, float(value) if member == "dVal" else int(value))


# nvmlValueType_t -> c_nvmlValue_t member.
_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _fits(count: Any, array: Any, needed: int) -> bool:
    """NVML's two-call protocol: report ``needed`` in ``count``; False when the array is short."""
    counter = out(count)
    capacity = int(counter.value)
    counter.value = needed
    return needed == 0 or (array is not None and capacity >= needed)
