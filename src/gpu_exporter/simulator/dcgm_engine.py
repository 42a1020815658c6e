"""A simulated DCGM host engine serving the simulated node's GPUs and MIG instances.

It keeps what reference/dcgm.md (section 7) says a faithful fake must keep: engine-global groups
and field groups (64 each, unique field-group names), watches removed with their connection,
all-or-nothing watches (a failed profiling watch undoes the call), sampling at the smallest
interval among watchers, wall-clock microsecond timestamps, a first sample as the watch is made,
and latest-value records carrying their own status with a BLANK value and ``ts = 0``.

Profiling samples are means of the simulated activity over the sample's update interval ending at
its timestamp; fields of metric groups that share a majorId take turns (one pass per sample) and
read BLANK, status OK, while their pass is not active [reference/dcgm.md section 3].

A ``dcgm_restart`` timeline event drops every remote connection and the engine's state (a host
engine that died and came back, possibly after ``downtime``); calls on an old handle then answer
CONNECTION_NOT_VALID, as the real client library does (it has no reconnect logic). An embedded
engine lives in the exporter's process and does not restart.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import yaml

from gpu_exporter.dcgm import structs as s
from gpu_exporter.simulator.errors import NvmlFailure

if TYPE_CHECKING:
    from gpu_exporter.simulator.devices import GpuDevice, MigDevice
    from gpu_exporter.simulator.nodeview import NodeView

# Profiling field -> the simulated activity it reports; FP pipes are not modelled (read 0).
PROF_METRICS: Mapping[int, str | None] = {
    1001: "util",
    1002: "sm",
    1003: "occupancy",
    1004: "tensor",
    1005: "dram",
    1006: None,
    1007: None,
    1008: None,
    1013: None,
    1014: "tensor",
}
# Profiling passes watched at once before PROFILING_MULTI_PASS [test_prof.py 38-40, 343-392].
MAX_MULTIPLEXED_GROUPS = 5
# The fake's GPU ids run in reverse NVML order: DCGM's ids are its own [DcgmCacheManager.cpp
# 1395-1412], so only the UUID maps them to NVML devices.
MAX_GPCS = 7  # nvmlDeviceGetMaxMigDeviceCount on the simulated MIG GPUs


def load_metric_groups() -> Mapping[str, list[tuple[int, int, tuple[int, ...]]]]:
    """Model key -> its profiling metric groups (``data/dcgm_metric_groups.yaml``)."""
    text = resources.files("gpu_exporter.simulator").joinpath("data/dcgm_metric_groups.yaml")
    raw: Mapping[str, Any] = yaml.safe_load(text.read_text())
    return {
        model: [(int(major), int(minor), tuple(int(f) for f in ids)) for major, minor, ids in g]
        for model, g in raw.items()
    }


class DcgmFailure(NvmlFailure):
    """A DCGM call's return code (negative), raised inside the fake and returned to the caller."""


Entity = tuple[int, int]  # (entity group, entity id)


@dataclass
class Group:
    connection: int
    name: str
    entities: list[Entity] = field(default_factory=list)


@dataclass
class FieldGroup:
    connection: int
    name: str
    field_ids: tuple[int, ...]


@dataclass
class Watch:
    """One (entity, field) watched by one connection's (group, field group) pair."""

    connection: int
    group: int
    field_group: int
    start: float  # simulated seconds
    interval: float


@dataclass
class Connection:
    embedded: bool
    address: str = ""


class DcgmEngine:
    """The engine's state; the fake library's functions call into it under the node lock."""

    def __init__(self, node: NodeView) -> None:
        self.node = node
        self.metric_groups = load_metric_groups()
        self.epoch = node.wall_origin  # the engine's wall clock at simulated t=0
        self.initialized = 0
        self.down_until = -math.inf
        self.restarts = 0
        self.connections: dict[int, Connection] = {}
        self.groups: dict[int, Group] = {}
        self.field_groups: dict[int, FieldGroup] = {}
        self.watches: dict[Entity, dict[int, list[Watch]]] = {}  # entity -> field -> watches
        self.in_use: set[int] = set()  # GPU indexes whose counters another process holds
        self._handles = itertools.count(1)
        self._ids = itertools.count(1)
        gpus = list(node.gpus)
        self.gpu_ids = {gpu.index: len(gpus) - 1 - gpu.index for gpu in gpus}
        self.by_gpu_id = {gpu_id: node.gpus[index] for index, gpu_id in self.gpu_ids.items()}

    def _instance_ids(self) -> dict[Entity, MigDevice]:
        """GPU_I and GPU_CI entity ids: ``gpuId x maxGpcs + n`` [DcgmCacheManager.cpp 919-980].
        Derived on each use: a ``mig_reconfigure`` event changes the instances."""
        entities: dict[Entity, MigDevice] = {}
        for gpu in self.node.gpus:
            base = self.gpu_ids[gpu.index] * MAX_GPCS
            for n, mig in enumerate(gpu.migs):
                entities[(s.EntityGroup.GPU_I, base + n)] = mig
                entities[(s.EntityGroup.GPU_CI, base + n)] = mig  # one CI per GI
        return entities

    # ------------------------------------------------------------------ time and lifecycle

    def now_us(self) -> int:
        return int((self.epoch + self.node.now()) * 1e6)

    def restart(self, downtime: float) -> None:
        """The host engine died: every remote connection and its state go; back after downtime."""
        self.restarts += 1
        self.down_until = self.node.now() + downtime
        for handle in [h for h, c in self.connections.items() if not c.embedded]:
            self.drop(handle)

    def hold_counters(self, gpus: set[int], held: bool) -> None:
        """Another process takes (or frees) these GPUs' profiling counters."""
        self.in_use = self.in_use | gpus if held else self.in_use - gpus

    def connect(self, address: str, embedded: bool) -> int:
        if embedded:
            self.connections[s.EMBEDDED_HANDLE] = Connection(True)
            return s.EMBEDDED_HANDLE
        if self.node.now() < self.down_until:
            raise DcgmFailure(s.Return.CONNECTION_NOT_VALID)  # nothing listens
        handle = next(self._handles)
        self.connections[handle] = Connection(False, address)
        return handle

    def connection(self, handle: int) -> Connection:
        connection = self.connections.get(handle)
        if connection is None:
            raise DcgmFailure(s.Return.CONNECTION_NOT_VALID)
        return connection

    def drop(self, handle: int) -> None:
        """A connection goes: its watches, groups and field groups with it
        [dcgm_structs.h 566-604; DcgmFieldGroup.cpp 382]."""
        self.connections.pop(handle, None)
        for fields in self.watches.values():
            for field_id, watches in list(fields.items()):
                fields[field_id] = [w for w in watches if w.connection != handle]
        for table in (self.groups, self.field_groups):
            for key in [k for k, v in table.items() if v.connection == handle]:
                del table[key]

    # ------------------------------------------------------------------ entities

    def gpu_of(self, entity: Entity) -> GpuDevice | None:
        group, entity_id = entity
        if group == s.EntityGroup.GPU:
            return self.by_gpu_id.get(entity_id)
        mig = self._instance_ids().get(entity)
        return mig.parent if mig is not None else None

    def device_of(self, entity: Entity) -> GpuDevice | MigDevice | None:
        if entity[0] == s.EntityGroup.GPU:
            return self.by_gpu_id.get(entity[1])
        return self._instance_ids().get(entity)

    def hierarchy(self) -> list[tuple[Entity, Entity, MigDevice]]:
        """Per MIG GPU, per instance: the GPU_I record then its CI [DcgmCacheManager.cpp
        16097-16170]."""
        records = []
        for gpu in self.node.gpus:
            base = self.gpu_ids[gpu.index] * MAX_GPCS
            for n, mig in enumerate(gpu.migs):
                gi = (int(s.EntityGroup.GPU_I), base + n)
                records.append((gi, (int(s.EntityGroup.GPU), self.gpu_ids[gpu.index]), mig))
                records.append(((int(s.EntityGroup.GPU_CI), base + n), gi, mig))
        return records

    # ------------------------------------------------------------------ groups and watches

    def new_id(self, limit_table: Mapping[int, Any]) -> int:
        if len(limit_table) >= s.MAX_NUM_GROUPS:
            raise DcgmFailure(s.Return.MAX_LIMIT)
        return next(self._ids)

    def watch(self, handle: int, group_id: int, field_group_id: int, interval: float) -> None:
        """All or nothing: every check passes before anything is added."""
        group = self.groups.get(group_id)
        field_group = self.field_groups.get(field_group_id)
        if group is None or field_group is None:
            raise DcgmFailure(s.Return.NOT_CONFIGURED)
        if not group.entities:
            raise DcgmFailure(s.Return.GROUP_IS_EMPTY)
        profiling = [f for f in field_group.field_ids if f in s.PROF_FIELD_RANGE]
        if profiling:
            self._check_profiling(group.entities, profiling)
        start = self.node.now()
        for entity in group.entities:
            fields = self.watches.setdefault(entity, {})
            for field_id in field_group.field_ids:
                fields.setdefault(field_id, []).append(
                    Watch(handle, group_id, field_group_id, start, interval)
                )

    def _check_profiling(self, entities: Sequence[Entity], field_ids: Sequence[int]) -> None:
        models = {gpu.model.key for gpu in map(self.gpu_of, entities) if gpu is not None}
        if len(models) > 1:
            raise DcgmFailure(s.Return.GROUP_INCOMPATIBLE)  # GPUs not identical
        for entity in entities:
            gpu = self.gpu_of(entity)
            if gpu is None:
                raise DcgmFailure(s.Return.BADPARAM)
            groups = self.metric_groups.get(gpu.model.key)
            if groups is None:
                raise DcgmFailure(s.Return.PROFILING_NOT_SUPPORTED)
            if gpu.index in self.in_use:
                raise DcgmFailure(s.Return.IN_USE)
            passes = {(g[0], g[1]) for g in groups if set(g[2]) & set(field_ids)}
            if any(not any(f in g[2] for g in groups) for f in field_ids):
                raise DcgmFailure(s.Return.NOT_SUPPORTED)
            if len(passes) > MAX_MULTIPLEXED_GROUPS:
                raise DcgmFailure(s.Return.PROFILING_MULTI_PASS)

    def unwatch(self, handle: int, group_id: int, field_group_id: int) -> None:
        if group_id not in self.groups or field_group_id not in self.field_groups:
            raise DcgmFailure(s.Return.NOT_CONFIGURED)
        for fields in self.watches.values():
            for field_id, watches in fields.items():
                fields[field_id] = [
                    w
                    for w in watches
                    if (w.connection, w.group, w.field_group) != (handle, group_id, field_group_id)
                ]

    # ------------------------------------------------------------------ reading

    def latest(self, entity: Entity, field_id: int, live: bool) -> tuple[int, int, Any]:
        """``(status, ts_us, value)`` of the latest sample; value None means the type's BLANK."""
        device = self.device_of(entity)
        if device is None:
            return int(s.Return.BADPARAM), 0, None
        if field_id == s.Field.DEV_GPU_UUID:
            return int(s.Return.OK), self.now_us(), device.uuid
        if field_id not in PROF_METRICS:
            return int(s.Return.UNKNOWN_FIELD), 0, None
        watches = self.watches.get(entity, {}).get(field_id)
        if not watches:
            return int(s.Return.NOT_WATCHED), 0, None
        interval = min(w.interval for w in watches)  # the fastest watcher wins
        start = min(w.start for w in watches)
        k = math.floor((self.node.now() - start) / interval + 1e-9)
        at = start + k * interval
        ts = int((self.epoch + at) * 1e6)
        gpu = device.gpu
        if gpu.index in self.in_use or not self._pass_active(entity, field_id, k):
            return int(s.Return.OK), ts, None  # another pass, or counters held elsewhere
        metric = PROF_METRICS[field_id]
        if metric is None:
            return int(s.Return.OK), ts, 0.0
        return int(s.Return.OK), ts, _mean(device, metric, max(0.0, at - interval), at)

    def _pass_active(self, entity: Entity, field_id: int, k: int) -> bool:
        gpu = self.gpu_of(entity)
        groups = self.metric_groups.get(gpu.model.key, []) if gpu else []
        watched = set(self.watches.get(entity, {}))
        minors: dict[int, list[int]] = {}
        mine: tuple[int, int] | None = None
        for major, minor, ids in groups:
            if watched & set(ids):
                minors.setdefault(major, []).append(minor)
            if field_id in ids and mine is None:
                mine = (major, minor)
        if mine is None:
            return True
        turns = sorted(minors.get(mine[0], [mine[1]]))
        return turns[k % len(turns)] == mine[1]


def _mean(device: GpuDevice | MigDevice, metric: str, a: float, b: float) -> float:
    """The scenario's mean activity over [a, b]: a MIG GPU's is its instances', by size."""
    migs: list[MigDevice] = getattr(device, "migs", [])
    if migs:
        return sum(m.weight * _mean(m, metric, a, b) for m in migs)
    if b <= a:
        return min(1.0, device.now(metric, b))  # type: ignore[arg-type]
    return min(1.0, device.mean(metric, a, b))  # type: ignore[arg-type]
