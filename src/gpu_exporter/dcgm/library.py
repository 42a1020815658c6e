"""The DCGM calls the activity source needs, over a swappable library object.

As pynvml does for ``libnvidia-ml``, functions are looked up by their C symbol name on one library
object (``ctypes.CDLL("libdcgm.so.4")``, or the simulator's fake with the same attributes) and
cached; a symbol the library lacks is ``DCGM_ST_FUNCTION_NOT_FOUND`` and a missing library is
``DCGM_ST_LIBRARY_NOT_FOUND``, as in DCGM's own bindings [testing/python3/dcgm_structs.py
660-760]. Arguments are passed the way those bindings pass them (no ``argtypes``): handles and
group ids as 64-bit values, out-parameters by reference, arrays as ctypes arrays
[testing/python3/dcgm_agent.py 70-1080]. Every call blocks (a remote request may wait up to 60 s
[DcgmApi.cpp 340, 418]), so callers run them on worker threads, never on the event loop.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import structs as s


class DcgmError(Exception):
    """A DCGM call answered something other than DCGM_ST_OK."""

    def __init__(self, code: int, function: str = "", message: str = "") -> None:
        self.code = int(code)
        self.function = function
        self.name = s.return_name(self.code)
        super().__init__(f"{function}: {message or self.name} ({self.code})")


@dataclass(frozen=True)
class FieldValue:
    """One record of a latest-values read; ``value`` is None when DCGM has no value: a
    per-record error status, a never-filled timestamp, or a BLANK sentinel."""

    entity_group: int
    entity_id: int
    field_id: int
    status: int
    ts_us: int  # microseconds since 1970, the engine's wall clock [dcgm_structs.h 2170-2195]
    value: float | int | str | None


@dataclass(frozen=True)
class MetricGroup:
    """A profiling metric group [dcgm_structs.h 4198-4250]."""

    major: int
    minor: int
    field_ids: tuple[int, ...]


@dataclass(frozen=True)
class MigEntity:
    """A GPU-instance or compute-instance record of the MIG hierarchy [dcgm_structs.h 750-806]."""

    entity_group: int
    entity_id: int
    parent_group: int
    parent_id: int
    gpu_uuid: str
    nvml_gpu_index: int
    nvml_instance_id: int
    nvml_compute_instance_id: int


def is_blank(value: float | int | str) -> bool:
    """The header's blank tests [dcgm_structs.h 43-158]: numbers at or above the type's BLANK
    marker, strings of the ``<<<...>>>`` form. INT32 blanks count too for int64 fields, as
    dcgm-exporter does [internal/pkg/collector/utils.go 35-61]."""
    if isinstance(value, str):
        return value.startswith("<<<") and ">>>" in value
    if isinstance(value, float):
        return value >= s.FP64_BLANK
    return value >= s.INT64_BLANK or s.INT32_BLANK <= value <= s.INT32_BLANK + 3


def decode_value(record: s.c_dcgmFieldValue_v2) -> float | int | str | None:
    """The record's value, or None for every form of "no value" DCGM uses: a record status other
    than OK (NOT_WATCHED, NO_DATA, ...) comes with ``ts = 0`` and a BLANK value
    [DcgmCacheManager.cpp 5059-5187; DcgmFvBuffer.cpp 252-297]; a multiplexed pass that was not
    active reads back BLANK with status OK [reference/dcgm.md section 3]."""
    if record.status != s.Return.OK or record.ts == 0:
        return None
    kind = int(record.fieldType)
    value: float | int | str
    if kind == s.FT_DOUBLE:
        value = float(record.value.dbl)
    elif kind in (s.FT_INT64, s.FT_TIMESTAMP):
        value = int(record.value.i64)
    elif kind == s.FT_STRING:
        value = record.value.str.decode(errors="replace")
    else:
        return None  # binary blobs: nothing the exporter reads
    return None if is_blank(value) else value


class DcgmLibrary:
    """DCGM's C API on one library object; methods raise :class:`DcgmError`."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._lock = threading.Lock()
        self._functions: dict[str, Callable[..., int]] = {}
        self.current_function: str | None = None  # the call in progress, to name a hung one

    @classmethod
    def load(cls, name: str = s.LIBRARY_NAME) -> DcgmLibrary:
        """``dlopen`` the real library (``DCGM_ST_LIBRARY_NOT_FOUND`` if absent)."""
        try:
            return cls(ctypes.CDLL(name))
        except OSError as exc:
            raise DcgmError(s.Return.LIBRARY_NOT_FOUND, "dlopen", str(exc)) from exc

    def _function(self, name: str) -> Callable[..., int]:
        with self._lock:
            function = self._functions.get(name)
            if function is None:
                try:
                    function = getattr(self._lib, name)
                except AttributeError:
                    raise DcgmError(s.Return.FUNCTION_NOT_FOUND, name) from None
                self._functions[name] = function
            return function

    def _call(self, name: str, *args: Any) -> None:
        function = self._function(name)
        self.current_function = name
        try:
            code = int(function(*args))
        finally:
            self.current_function = None
        if code != s.Return.OK:
            raise DcgmError(code, name, self.error_string(code))

    def error_string(self, code: int) -> str:
        """The library's text for ``code``: exported as ``errorString``, not ``dcgmErrorString``
        [dcgmlib/dcgm_agent.h]; the code's name when the library has no text."""
        try:
            function = self._function("errorString")
        except DcgmError:
            return s.return_name(code)
        function.restype = ctypes.c_char_p  # type: ignore[attr-defined]
        text = function(ctypes.c_int(code))
        return text.decode(errors="replace") if isinstance(text, bytes) else s.return_name(code)

    # -- connecting [dcgm_agent.h; reference/dcgm.md section 1] ------------------------------

    def init(self) -> None:
        """``dcgmInit(void)``: before StartEmbedded or Connect; again is harmless."""
        self._call("dcgmInit")

    def shutdown(self) -> None:
        """``dcgmShutdown(void)``: also stops embedded engines and remote connections."""
        self._call("dcgmShutdown")

    def start_embedded(self, mode: int = s.OPERATION_MODE_AUTO) -> int:
        """``dcgmStartEmbedded(opMode, *handle)``; the handle is ``EMBEDDED_HANDLE``."""
        handle = s.c_dcgmHandle_t()
        self._call("dcgmStartEmbedded", ctypes.c_int(mode), ctypes.byref(handle))
        return int(handle.value)

    def stop_embedded(self, handle: int) -> None:
        self._call("dcgmStopEmbedded", s.c_dcgmHandle_t(handle))

    def connect(self, address: str, *, unix_socket: bool, timeout_ms: int) -> int:
        """``dcgmConnect_v2(address, params, *handle)``: ``host[:port]`` (port 5555 by default)
        or a socket path with ``addressIsUnixSocket=1``; a failure after ``timeoutMs`` is
        ``CONNECTION_NOT_VALID`` [DcgmApi.cpp 6236-6305; DcgmClientHandler.cpp 222-284]."""
        params = s.c_dcgmConnectV2Params_v2()
        params.version = s.CONNECT_V2_PARAMS_VERSION
        params.persistAfterDisconnect = 0
        params.timeoutMs = max(1, timeout_ms)  # 0 would mean 5000 ms
        params.addressIsUnixSocket = 1 if unix_socket else 0
        handle = s.c_dcgmHandle_t()
        self._call("dcgmConnect_v2", address.encode(), ctypes.byref(params), ctypes.byref(handle))
        return int(handle.value)

    def disconnect(self, handle: int) -> None:
        self._call("dcgmDisconnect", s.c_dcgmHandle_t(handle))

    # -- discovery [dcgm_agent.h 356-458] ------------------------------------------------------

    def supported_gpus(self, handle: int) -> list[int]:
        """``dcgmGetAllSupportedDevices(handle, gpuIdList[32], *count)``: DCGM's own gpu ids."""
        ids = (ctypes.c_uint * s.MAX_NUM_DEVICES)()
        count = ctypes.c_int()
        self._call("dcgmGetAllSupportedDevices", s.c_dcgmHandle_t(handle), ids, ctypes.byref(count))
        return [int(ids[i]) for i in range(count.value)]

    def mig_hierarchy(self, handle: int) -> list[MigEntity]:
        """``dcgmGetGpuInstanceHierarchy(handle, *dcgmMigHierarchy_v2)``."""
        hierarchy = s.c_dcgmMigHierarchy_v2()
        hierarchy.version = s.MIG_HIERARCHY_VERSION
        self._call("dcgmGetGpuInstanceHierarchy", s.c_dcgmHandle_t(handle), ctypes.byref(hierarchy))
        entities = []
        for i in range(min(hierarchy.count, s.MAX_HIERARCHY_INFO)):
            item = hierarchy.entityList[i]
            entities.append(
                MigEntity(
                    entity_group=int(item.entity.entityGroupId),
                    entity_id=int(item.entity.entityId),
                    parent_group=int(item.parent.entityGroupId),
                    parent_id=int(item.parent.entityId),
                    gpu_uuid=item.info.gpuUuid.decode(errors="replace"),
                    nvml_gpu_index=int(item.info.nvmlGpuIndex),
                    nvml_instance_id=int(item.info.nvmlInstanceId),
                    nvml_compute_instance_id=int(item.info.nvmlComputeInstanceId),
                )
            )
        return entities

    def metric_groups(self, handle: int, gpu_id: int) -> list[MetricGroup]:
        """``dcgmProfGetSupportedMetricGroups``: which profiling fields can be watched, in
        groups; the same majorId with another minorId needs another pass [dcgm_structs.h
        4198-4250]. NOT_SUPPORTED, PROFILING_NOT_SUPPORTED, MODULE_NOT_LOADED, ... raise."""
        request = s.c_dcgmProfGetMetricGroups_v3()
        request.version = s.PROF_GET_METRIC_GROUPS_VERSION
        request.gpuId = gpu_id
        self._call(
            "dcgmProfGetSupportedMetricGroups", s.c_dcgmHandle_t(handle), ctypes.byref(request)
        )
        groups = []
        for i in range(min(request.numMetricGroups, s.PROF_MAX_NUM_GROUPS_V2)):
            group = request.metricGroups[i]
            count = min(group.numFieldIds, s.PROF_MAX_FIELD_IDS_PER_GROUP_V2)
            fields = tuple(int(group.fieldIds[j]) for j in range(count))
            groups.append(MetricGroup(int(group.majorId), int(group.minorId), fields))
        return groups

    # -- groups, field groups, watches [dcgm_agent.h 1064-1097; reference section 2] --------

    def group_create(self, handle: int, name: str) -> int:
        """``dcgmGroupCreate(handle, DCGM_GROUP_EMPTY, name, *group)``."""
        group = s.c_dcgmGpuGrp_t()
        self._call(
            "dcgmGroupCreate",
            s.c_dcgmHandle_t(handle),
            ctypes.c_int(s.GroupType.EMPTY),
            name.encode(),
            ctypes.byref(group),
        )
        return int(group.value)

    def group_add_entity(self, handle: int, group: int, entity_group: int, entity: int) -> None:
        self._call(
            "dcgmGroupAddEntity",
            s.c_dcgmHandle_t(handle),
            s.c_dcgmGpuGrp_t(group),
            ctypes.c_int(entity_group),
            ctypes.c_uint(entity),
        )

    def group_destroy(self, handle: int, group: int) -> None:
        self._call("dcgmGroupDestroy", s.c_dcgmHandle_t(handle), s.c_dcgmGpuGrp_t(group))

    def field_group_create(self, handle: int, field_ids: Sequence[int], name: str) -> int:
        """``dcgmFieldGroupCreate``: 1..128 ids; a name already used on the engine, by any
        client, is ``DUPLICATE_KEY`` [DcgmFieldGroup.cpp 130-170]."""
        ids = (ctypes.c_ushort * len(field_ids))(*field_ids)
        field_group = s.c_dcgmFieldGrp_t()
        self._call(
            "dcgmFieldGroupCreate",
            s.c_dcgmHandle_t(handle),
            ctypes.c_int(len(field_ids)),
            ids,
            name.encode(),
            ctypes.byref(field_group),
        )
        return int(field_group.value)

    def field_group_destroy(self, handle: int, field_group: int) -> None:
        self._call(
            "dcgmFieldGroupDestroy", s.c_dcgmHandle_t(handle), s.c_dcgmFieldGrp_t(field_group)
        )

    def watch_fields(
        self, handle: int, group: int, field_group: int, interval_us: int, keep_age_s: float
    ) -> None:
        """``dcgmWatchFields(handle, group, fieldGroup, updateFreq us, maxKeepAge s,
        maxKeepSamples)``: all or nothing, a failed profiling watch undoes the whole call
        [DcgmHostEngineHandler.cpp 4560-4690]."""
        self._call(
            "dcgmWatchFields",
            s.c_dcgmHandle_t(handle),
            s.c_dcgmGpuGrp_t(group),
            s.c_dcgmFieldGrp_t(field_group),
            ctypes.c_int64(interval_us),
            ctypes.c_double(keep_age_s),
            ctypes.c_int32(0),
        )

    def unwatch_fields(self, handle: int, group: int, field_group: int) -> None:
        self._call(
            "dcgmUnwatchFields",
            s.c_dcgmHandle_t(handle),
            s.c_dcgmGpuGrp_t(group),
            s.c_dcgmFieldGrp_t(field_group),
        )

    # -- reading [dcgm_agent.h 1262-1290] -----------------------------------------------------

    def latest_values(
        self,
        handle: int,
        entities: Sequence[tuple[int, int]],
        field_ids: Sequence[int],
        *,
        live: bool = False,
    ) -> list[FieldValue]:
        """``dcgmEntitiesGetLatestValues``: entities x fields records, in no guaranteed order
        (match them by entity and field); each carries its own status."""
        if not entities or not field_ids:
            return []
        pairs = (s.c_dcgmGroupEntityPair_t * len(entities))()
        for slot, (group, entity) in enumerate(entities):
            pairs[slot].entityGroupId, pairs[slot].entityId = group, entity
        fields = (ctypes.c_ushort * len(field_ids))(*field_ids)
        count = len(entities) * len(field_ids)
        values = (s.c_dcgmFieldValue_v2 * count)()
        self._call(
            "dcgmEntitiesGetLatestValues",
            s.c_dcgmHandle_t(handle),
            pairs,
            ctypes.c_uint(len(entities)),
            fields,
            ctypes.c_uint(len(field_ids)),
            ctypes.c_uint(s.FV_FLAG_LIVE_DATA if live else 0),
            values,
        )
        return [_field_value(values[i]) for i in range(count)]


def _field_value(record: s.c_dcgmFieldValue_v2) -> FieldValue:
    return FieldValue(
        entity_group=int(record.entityGroupId),
        entity_id=int(record.entityId),
        field_id=int(record.fieldId),
        status=int(record.status),
        ts_us=int(record.ts),
        value=decode_value(record),
    )
