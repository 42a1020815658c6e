"""One connection to a DCGM host engine: what it watches for which NVML device, and its reads.

Everything here blocks (DCGM calls), so it runs on a worker thread; :mod:`.service` bounds each
step and owns the session's lifecycle. The sequence follows reference/dcgm.md section 2:

1. ``dcgmInit``, then ``dcgmConnect_v2`` (``--dcgm.address``) or ``dcgmStartEmbedded(AUTO)``.
2. DCGM's GPU ids are its own (not NVML indexes [DcgmCacheManager.cpp 1395-1412]): each is mapped
   to an NVML device by UUID (field 54, read live); MIG instances by (parent UUID, NVML GPU
   instance id) from the MIG hierarchy, never by entity id [DcgmCacheManager.cpp 919-980].
3. Per GPU model, the supported profiling metric groups decide which activity fields can be
   watched together: a field whose group shares a majorId with a chosen group of another minorId
   would need another hardware pass, and is left out [dcgm_structs.h 4211-4215].
4. The profiling fields get their own field group (a failed profiling watch undoes the whole
   call [DcgmHostEngineHandler.cpp 4560-4690]) with an engine-unique name (names are global to
   the engine, DUPLICATE_KEY otherwise [DcgmFieldGroup.cpp 130-170]); one entity group per GPU
   (its whole-GPU entity and its GPU instances), so one GPU whose counters are in use elsewhere
   costs only that GPU.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import count

from ..logs import get_logger
from . import structs as s
from .library import DcgmError, DcgmLibrary, FieldValue, MetricGroup
from .target import Target

_log = get_logger("dcgm")
Entity = tuple[int, int]

# The activity fields in priority order (when metric groups conflict, earlier ones win).
ACTIVITY_FIELDS = (
    s.Field.PROF_SM_ACTIVE,
    s.Field.PROF_PIPE_TENSOR_ACTIVE,
    s.Field.PROF_DRAM_ACTIVE,
    s.Field.PROF_SM_OCCUPANCY,
)
# Samples kept by the engine per watched field, in seconds (dcgm-exporter keeps 600 s
# [device_watcher.go 142-184]; only the latest is read here).
KEEP_AGE_S = 60.0
# Errors that mean the engine is gone: reconnect [DcgmClientHandler.cpp; reference section 1].
CONNECTION_LOST = frozenset({s.Return.CONNECTION_NOT_VALID})


@dataclass(frozen=True)
class WantedDevice:
    """An NVML device without GPM that DCGM should serve."""

    uuid: str
    model: str
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None


def choose_fields(groups: Sequence[MetricGroup]) -> tuple[int, ...]:
    """The activity fields watchable in one pass set: per majorId one minorId."""
    chosen: dict[int, int] = {}
    fields: list[int] = []
    for field_id in ACTIVITY_FIELDS:
        for group in groups:
            if field_id in group.field_ids and chosen.setdefault(group.major, group.minor) == (
                group.minor
            ):
                fields.append(int(field_id))
                break
    return tuple(sorted(fields))


class Names:
    """Engine-unique group names: this process, a random token, a counter."""

    def __init__(self) -> None:
        self._prefix = f"gpu-exporter-{os.getpid()}-{secrets.token_hex(4)}"
        self._counter = count(1)

    def __call__(self, purpose: str) -> str:
        return f"{self._prefix}-{purpose}-{next(self._counter)}"


@dataclass
class Session:
    """A connected engine and what it watches; ``unwatched`` says why a device is not served."""

    lib: DcgmLibrary
    target: Target
    names: Names
    interval_us: int
    connect_timeout_ms: int = 2000
    handle: int | None = None
    served: dict[Entity, str] = field(default_factory=dict)  # entity -> NVML uuid
    fields: dict[Entity, tuple[int, ...]] = field(default_factory=dict)
    unwatched: dict[str, str] = field(default_factory=dict)  # uuid -> reason
    groups: list[tuple[int, int]] = field(default_factory=list)  # (group, field group) watched
    field_groups: dict[tuple[int, ...], int] = field(default_factory=dict)
    _loose_groups: list[int] = field(default_factory=list)

    # -- opening --------------------------------------------------------------------------

    def open(self, wanted: Sequence[WantedDevice]) -> None:
        """Connect, map, choose and watch. Raises DcgmError when the engine cannot be used."""
        self.lib.init()
        if self.target.embedded:
            self.handle = self.lib.start_embedded(s.OPERATION_MODE_AUTO)
        else:
            assert self.target.address is not None
            self.handle = self.lib.connect(
                self.target.address,
                unix_socket=self.target.unix_socket,
                timeout_ms=self.connect_timeout_ms,
            )
        per_gpu = self._map(wanted)
        for gpu_id, entities in per_gpu.items():
            self._watch_gpu(gpu_id, entities)

    def _map(self, wanted: Sequence[WantedDevice]) -> dict[int, list[tuple[Entity, str]]]:
        """DCGM entity per wanted device, grouped by DCGM GPU id; the rest are unwatched."""
        assert self.handle is not None
        gpu_ids = self.lib.supported_gpus(self.handle)
        pairs = [(int(s.EntityGroup.GPU), g) for g in gpu_ids]
        by_uuid = {
            str(r.value): r.entity_id
            for r in self.lib.latest_values(self.handle, pairs, [s.Field.DEV_GPU_UUID], live=True)
            if isinstance(r.value, str)
        }
        instances = self._instances() if any(w.parent_uuid for w in wanted) else {}
        per_gpu: dict[int, list[tuple[Entity, str]]] = {}
        for device in wanted:
            if device.parent_uuid is None:
                gpu_id = by_uuid.get(device.uuid)
                entity = None if gpu_id is None else (int(s.EntityGroup.GPU), gpu_id)
            else:
                key = (device.parent_uuid, device.gpu_instance_id)
                entity = instances.get(key)
                gpu_id = by_uuid.get(device.parent_uuid)
            if entity is None or gpu_id is None:
                self.unwatched[device.uuid] = "not_found"
                continue
            per_gpu.setdefault(gpu_id, []).append((entity, device.uuid))
        return per_gpu

    def _instances(self) -> dict[tuple[str, int | None], Entity]:
        """(parent UUID, NVML GPU instance id) -> the GPU_I entity. MIG discovery can need root
        [DcgmCacheManager.cpp 912-917]: then instances are simply not served."""
        assert self.handle is not None
        try:
            records = self.lib.mig_hierarchy(self.handle)
        except DcgmError as exc:
            if exc.code in CONNECTION_LOST:
                raise
            _log.warning("dcgm: no MIG hierarchy; MIG instances not served", error=exc.name)
            return {}
        return {
            (r.gpu_uuid, r.nvml_instance_id): (r.entity_group, r.entity_id)
            for r in records
            if r.entity_group == s.EntityGroup.GPU_I
        }

    def _watch_gpu(self, gpu_id: int, entities: list[tuple[Entity, str]]) -> None:
        """One group per GPU; its failure (IN_USE, PROFILING_NOT_SUPPORTED, ...) is its own."""
        assert self.handle is not None
        try:
            fields = choose_fields(self.lib.metric_groups(self.handle, gpu_id))
            if not fields:
                raise DcgmError(s.Return.PROFILING_NOT_SUPPORTED, "choose_fields")
            field_group = self._field_group(fields)
            group = self.lib.group_create(self.handle, self.names("gpu"))
            self._loose_groups.append(group)
            for entity, _ in entities:
                self.lib.group_add_entity(self.handle, group, *entity)
            self.lib.watch_fields(self.handle, group, field_group, self.interval_us, KEEP_AGE_S)
        except DcgmError as exc:
            if exc.code in CONNECTION_LOST:
                raise
            for _, uuid in entities:
                self.unwatched[uuid] = exc.name
            return
        self._loose_groups.remove(group)
        self.groups.append((group, field_group))
        for entity, uuid in entities:
            self.served[entity] = uuid
            self.fields[entity] = fields

    def _field_group(self, fields: tuple[int, ...]) -> int:
        assert self.handle is not None
        found = self.field_groups.get(fields)
        if found is None:
            try:
                found = self.lib.field_group_create(self.handle, fields, self.names("activity"))
            except DcgmError as exc:
                if exc.code != s.Return.DUPLICATE_KEY:
                    raise
                found = self.lib.field_group_create(self.handle, fields, self.names("activity"))
            self.field_groups[fields] = found
        return found

    # -- reading --------------------------------------------------------------------------

    def read(self) -> dict[str, dict[int, FieldValue]]:
        """NVML uuid -> field id -> its latest record (one call for every served entity)."""
        if self.handle is None or not self.served:
            return {}
        entities = list(self.served)
        field_ids = sorted({f for fields in self.fields.values() for f in fields})
        result: dict[str, dict[int, FieldValue]] = {}
        for record in self.lib.latest_values(self.handle, entities, field_ids):
            entity = (record.entity_group, record.entity_id)
            uuid = self.served.get(entity)
            if uuid is not None and record.field_id in self.fields[entity]:
                result.setdefault(uuid, {})[record.field_id] = record
        return result

    # -- closing --------------------------------------------------------------------------

    def close(self) -> None:
        """Undo what was made, best effort (a dead engine already dropped it all)."""
        if self.handle is None:
            return
        handle, self.handle = self.handle, None
        steps: list[Callable[[], None]] = []
        lib = self.lib
        for group, field_group in self.groups:
            steps.append(partial(lib.unwatch_fields, handle, group, field_group))
        for group in [g for g, _ in self.groups] + self._loose_groups:
            steps.append(partial(lib.group_destroy, handle, group))
        for field_group in self.field_groups.values():
            steps.append(partial(lib.field_group_destroy, handle, field_group))
        stop = lib.stop_embedded if self.target.embedded else lib.disconnect
        steps.append(partial(stop, handle))
        _run_all(steps)


def _run_all(steps: Iterable[Callable[[], None]]) -> None:
    for step in steps:
        try:
            step()
        except DcgmError as exc:
            if exc.code in CONNECTION_LOST:
                return  # the engine is gone, and with it everything this session made
