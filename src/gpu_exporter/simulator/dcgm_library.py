"""The fake ``libdcgm.so.4``: an object whose attributes are DCGM's C functions.

It stands in for ``ctypes.CDLL("libdcgm.so.4")`` under
:class:`gpu_exporter.dcgm.library.DcgmLibrary` exactly as the fake NVML library stands in under
pynvml: the binding's real argument marshalling (ctypes structs, arrays, ``byref``) reaches these
functions unchanged, and each returns a ``dcgmReturn_t`` int and never raises. Behaviour is
cited in :mod:`.dcgm_engine` and in reference/dcgm.md; the state lives in the node's
:class:`~.dcgm_engine.DcgmEngine`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpu_exporter.dcgm import structs as s
from gpu_exporter.simulator.dcgm_engine import DcgmEngine, DcgmFailure, FieldGroup, Group
from gpu_exporter.simulator.errors import NvmlFailure

if TYPE_CHECKING:
    from gpu_exporter.simulator.nodeview import NodeView

log = logging.getLogger(__name__)
_NO_INIT = frozenset({"dcgmInit", "errorString"})


def out(ref: Any) -> Any:
    """The object behind ``byref(obj)``; BADPARAM for NULL (as DCGM checks its pointers)."""
    if ref is None:
        raise DcgmFailure(s.Return.BADPARAM)
    return getattr(ref, "_obj", ref)


def val(arg: Any) -> Any:
    """The Python value of a ctypes scalar or a plain int."""
    return getattr(arg, "value", arg)


class DcgmFunctions:
    """The implemented DCGM functions; method names are the C symbols."""

    def __init__(self, engine: DcgmEngine) -> None:
        self.engine = engine

    def _handle(self, handle: Any) -> int:
        value = int(val(handle))
        self.engine.connection(value)
        return value

    def dcgmInit(self) -> int:
        self.engine.initialized += 1
        return 0

    def dcgmShutdown(self) -> int:
        for handle in list(self.engine.connections):
            self.engine.drop(handle)
        self.engine.initialized = 0
        return 0

    def dcgmStartEmbedded(self, mode: Any, handle: Any) -> int:
        if int(val(mode)) not in (s.OPERATION_MODE_AUTO, s.OPERATION_MODE_MANUAL):
            raise DcgmFailure(s.Return.BADPARAM)
        out(handle).value = self.engine.connect("", embedded=True)
        return 0

    def dcgmStopEmbedded(self, handle: Any) -> int:
        if int(val(handle)) != s.EMBEDDED_HANDLE:
            raise DcgmFailure(s.Return.BADPARAM)
        self.engine.drop(s.EMBEDDED_HANDLE)
        return 0

    def dcgmConnect_v2(self, address: Any, params: Any, handle: Any) -> int:
        """NULL/empty address or params: BADPARAM; v1 or v2 params, else VER_MISMATCH
        [DcgmApi.cpp 6236-6305]."""
        if not address or params is None or handle is None:
            raise DcgmFailure(s.Return.BADPARAM)
        request = out(params)
        if request.version not in (s.CONNECT_V2_PARAMS_VERSION, s.CONNECT_V2_PARAMS_VERSION_1):
            raise DcgmFailure(s.Return.VER_MISMATCH)
        text = address.decode() if isinstance(address, bytes) else str(address)
        out(handle).value = self.engine.connect(text, embedded=False)
        return 0

    def dcgmDisconnect(self, handle: Any) -> int:
        self.engine.drop(self._handle(handle))
        return 0

    def dcgmGetAllSupportedDevices(self, handle: Any, ids: Any, count: Any) -> int:
        self._handle(handle)
        gpu_ids = sorted(self.engine.by_gpu_id)
        for slot, gpu_id in enumerate(gpu_ids[: s.MAX_NUM_DEVICES]):
            ids[slot] = gpu_id
        out(count).value = min(len(gpu_ids), s.MAX_NUM_DEVICES)
        return 0

    def dcgmGetGpuInstanceHierarchy(self, handle: Any, hierarchy: Any) -> int:
        self._handle(handle)
        result = out(hierarchy)
        if result.version != s.MIG_HIERARCHY_VERSION:
            raise DcgmFailure(s.Return.VER_MISMATCH)
        records = self.engine.hierarchy()
        result.count = len(records)
        for slot, (entity, parent, mig) in enumerate(records):
            item = result.entityList[slot]
            item.entity.entityGroupId, item.entity.entityId = entity
            item.parent.entityGroupId, item.parent.entityId = parent
            item.info.gpuUuid = mig.parent.uuid.encode()
            item.info.nvmlGpuIndex = mig.parent.index
            item.info.nvmlInstanceId = mig.spec.gpu_instance_id
            is_gi = entity[0] == s.EntityGroup.GPU_I
            item.info.nvmlComputeInstanceId = s.NO_COMPUTE_INSTANCE if is_gi else 0
            item.info.nvmlMigProfileId = mig.spec.profile.profile_id
            item.info.nvmlProfileSlices = mig.spec.profile.slices
        return 0

    def dcgmProfGetSupportedMetricGroups(self, handle: Any, request: Any) -> int:
        self._handle(handle)
        query = out(request)
        if query.version != s.PROF_GET_METRIC_GROUPS_VERSION:
            raise DcgmFailure(s.Return.VER_MISMATCH)
        gpu = self.engine.by_gpu_id.get(int(query.gpuId))
        if gpu is None:
            raise DcgmFailure(s.Return.BADPARAM)
        groups = self.engine.metric_groups.get(gpu.model.key)
        if groups is None:
            raise DcgmFailure(s.Return.PROFILING_NOT_SUPPORTED)
        query.numMetricGroups = len(groups)
        for slot, (major, minor, ids) in enumerate(groups):
            group = query.metricGroups[slot]
            group.majorId, group.minorId, group.numFieldIds = major, minor, len(ids)
            for i, field_id in enumerate(ids):
                group.fieldIds[i] = field_id
        return 0

    def dcgmGroupCreate(self, handle: Any, kind: Any, name: Any, group: Any) -> int:
        connection = self._handle(handle)
        if int(val(kind)) != s.GroupType.EMPTY:
            raise DcgmFailure(s.Return.NOT_SUPPORTED)  # the fake makes empty groups only
        group_id = self.engine.new_id(self.engine.groups)
        self.engine.groups[group_id] = Group(connection, _text(name))
        out(group).value = group_id
        return 0

    def dcgmGroupAddEntity(self, handle: Any, group: Any, entity_group: Any, entity: Any) -> int:
        self._handle(handle)
        found = self.engine.groups.get(int(val(group)))
        if found is None:
            raise DcgmFailure(s.Return.NOT_CONFIGURED)
        pair = (int(val(entity_group)), int(val(entity)))
        if self.engine.device_of(pair) is None or pair in found.entities:
            raise DcgmFailure(s.Return.BADPARAM)
        found.entities.append(pair)
        return 0

    def dcgmGroupDestroy(self, handle: Any, group: Any) -> int:
        self._handle(handle)
        if self.engine.groups.pop(int(val(group)), None) is None:
            raise DcgmFailure(s.Return.NOT_CONFIGURED)
        return 0

    def dcgmFieldGroupCreate(
        self, handle: Any, count: Any, ids: Any, name: Any, field_group: Any
    ) -> int:
        """1..128 ids; a name in use on the engine is DUPLICATE_KEY [DcgmFieldGroup.cpp
        130-170]."""
        connection = self._handle(handle)
        n = int(val(count))
        if not 1 <= n <= s.MAX_FIELD_IDS_PER_FIELD_GROUP:
            raise DcgmFailure(s.Return.BADPARAM)
        text = _text(name)
        if any(fg.name == text for fg in self.engine.field_groups.values()):
            raise DcgmFailure(s.Return.DUPLICATE_KEY)
        if len(self.engine.field_groups) >= s.MAX_NUM_FIELD_GROUPS:
            raise DcgmFailure(s.Return.MAX_LIMIT)
        field_ids = tuple(int(ids[i]) for i in range(n))
        known = {int(f) for f in s.Field} | set(range(1001, 1015))
        if any(f not in known for f in field_ids):
            raise DcgmFailure(s.Return.BADPARAM)  # an unknown field id
        field_group_id = self.engine.new_id(self.engine.field_groups)
        self.engine.field_groups[field_group_id] = FieldGroup(connection, text, field_ids)
        out(field_group).value = field_group_id
        return 0

    def dcgmFieldGroupDestroy(self, handle: Any, field_group: Any) -> int:
        self._handle(handle)
        if self.engine.field_groups.pop(int(val(field_group)), None) is None:
            raise DcgmFailure(s.Return.NOT_CONFIGURED)
        return 0

    def dcgmWatchFields(
        self, handle: Any, group: Any, field_group: Any, freq: Any, age: Any, samples: Any
    ) -> int:
        connection = self._handle(handle)
        interval = int(val(freq)) / 1e6
        if interval <= 0:
            raise DcgmFailure(s.Return.BADPARAM)
        self.engine.watch(connection, int(val(group)), int(val(field_group)), interval)
        return 0

    def dcgmUnwatchFields(self, handle: Any, group: Any, field_group: Any) -> int:
        connection = self._handle(handle)
        self.engine.unwatch(connection, int(val(group)), int(val(field_group)))
        return 0

    def dcgmEntitiesGetLatestValues(
        self,
        handle: Any,
        entities: Any,
        entity_count: Any,
        fields: Any,
        field_count: Any,
        flags: Any,
        values: Any,
    ) -> int:
        """entities x fields records; per-record status; a reversed order, since DCGM does not
        promise one [dcgm_agent.h 1262-1290]."""
        self._handle(handle)
        live = bool(int(val(flags)) & s.FV_FLAG_LIVE_DATA)
        pairs = [
            (entities[i].entityGroupId, entities[i].entityId) for i in range(val(entity_count))
        ]
        field_ids = [int(fields[i]) for i in range(val(field_count))]
        wanted = [(p, f) for p in pairs for f in field_ids]
        for slot, (pair, field_id) in enumerate(reversed(wanted)):
            _fill(values[slot], pair, field_id, *self.engine.latest(pair, field_id, live))
        return 0


def _fill(
    record: Any, pair: tuple[int, int], field_id: int, status: int, ts: int, value: Any
) -> None:
    record.version = s.FIELD_VALUE_VERSION_2
    record.entityGroupId, record.entityId = pair
    record.fieldId, record.status, record.ts = field_id, status, ts
    if field_id == s.Field.DEV_GPU_UUID:
        record.fieldType = s.FT_STRING
        record.value.str = (value if value is not None else s.STR_BLANK).encode()
    else:
        record.fieldType = s.FT_DOUBLE
        record.value.dbl = s.FP64_BLANK if value is None else float(value)


def _text(name: Any) -> str:
    if name is None:
        raise DcgmFailure(s.Return.BADPARAM)
    return name.decode() if isinstance(name, bytes) else str(name)


DCGM_FUNCTIONS = frozenset(n for n in dir(DcgmFunctions) if n.startswith("dcgm"))
ERROR_TEXT = {int(code): code.name.replace("_", " ").capitalize() for code in s.Return}


class FakeDcgmLibrary:
    """Stands in for ``ctypes.CDLL("libdcgm.so.4")``; missing symbols raise AttributeError."""

    def __init__(self, node: NodeView, engine: DcgmEngine) -> None:
        functions = DcgmFunctions(engine)
        for name in DCGM_FUNCTIONS:
            setattr(self, name, _entry_point(node, engine, name, getattr(functions, name)))

        def errorString(code: Any) -> bytes:
            number = int(val(code))
            return ERROR_TEXT.get(number, f"Unknown error ({number})").encode()

        self.errorString = errorString


def _entry_point(
    node: NodeView, engine: DcgmEngine, name: str, method: Callable[..., int]
) -> Callable[..., int]:
    def entry(*args: Any) -> int:
        if name not in _NO_INIT and engine.initialized == 0:
            return int(s.Return.UNINITIALIZED)
        node.calls[name] += 1
        node.advance(integrate=False)
        hang = node.hang_for(name, None)
        if hang is not None:
            hang.released.wait(hang.remaining())
        try:
            with node.lock:
                return method(*args)
        except NvmlFailure as failure:
            return int(failure.code)
        except Exception:  # a C library cannot raise into Python
            log.exception("simulated %s failed", name)
            return int(s.Return.GENERIC_ERROR)

    entry.__name__ = entry.__qualname__ = name
    return entry
