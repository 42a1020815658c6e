"""The ctypes binding: layouts and version words as DCGM's headers have them, and the calls
against the simulator's fake libdcgm (the same library object the exporter uses)."""

from __future__ import annotations

import ctypes

import pytest

from gpu_exporter.dcgm import structs as s
from gpu_exporter.dcgm.library import DcgmError, DcgmLibrary, decode_value, is_blank

from .helpers import fake_library

# reference/dcgm.md, "Struct versions": (struct, size in bytes, version word).
LAYOUTS = [
    (s.c_dcgmFieldValue_v1, 4120, s.FIELD_VALUE_VERSION_1, 0x01001018),
    (s.c_dcgmFieldValue_v2, 4128, s.FIELD_VALUE_VERSION_2, 0x02001020),
    (s.c_dcgmConnectV2Params_v1, 8, s.CONNECT_V2_PARAMS_VERSION_1, 0x01000008),
    (s.c_dcgmConnectV2Params_v2, 16, s.CONNECT_V2_PARAMS_VERSION, 0x02000010),
    (s.c_dcgmProfGetMetricGroups_v3, 1376, s.PROF_GET_METRIC_GROUPS_VERSION, 0x03000560),
    (s.c_dcgmMigHierarchy_v2, 73480, s.MIG_HIERARCHY_VERSION, 0x02011F08),
]


@pytest.mark.parametrize(("struct", "size", "version", "expected"), LAYOUTS)
def test_struct_sizes_and_version_words_match_the_headers(
    struct: type[ctypes.Structure], size: int, version: int, expected: int
) -> None:
    assert ctypes.sizeof(struct) == size, f"{struct.__name__} is not laid out as in dcgm_structs.h"
    assert version == expected, f"{struct.__name__} version word {version:#x} != {expected:#x}"


def test_field_value_offsets_match_the_header() -> None:
    # dcgmFieldValue_v2 [dcgm_structs.h 2170-2195], as tabled in reference/dcgm.md section 5.
    offsets = {
        name: getattr(s.c_dcgmFieldValue_v2, name).offset
        for name, *_ in s.c_dcgmFieldValue_v2._fields_
    }
    assert offsets == {
        "version": 0,
        "entityGroupId": 4,
        "entityId": 8,
        "fieldId": 12,
        "fieldType": 14,
        "status": 16,
        "unused": 20,
        "ts": 24,
        "value": 32,
    }
    assert s.c_dcgmFieldValue_v1.ts.offset == 16
    assert s.c_dcgmFieldValue_v1.value.offset == 24
    assert ctypes.sizeof(s.c_dcgmMigEntityInfo_t) == 148
    assert ctypes.sizeof(s.c_dcgmMigHierarchyInfo_v2) == 164
    assert ctypes.sizeof(s.c_dcgmProfMetricGroupInfo_v2) == 136
    assert ctypes.sizeof(s.c_dcgmGroupEntityPair_t) == 8


@pytest.mark.parametrize(
    "value",
    [
        s.INT64_BLANK,
        s.INT64_BLANK + 3,
        s.INT32_BLANK,
        s.INT32_BLANK + 3,
        s.FP64_BLANK,
        s.FP64_BLANK + 2.0,
        s.STR_BLANK,
        s.STR_NOT_FOUND,
        s.STR_NOT_SUPPORTED,
        s.STR_NOT_PERMISSIONED,
    ],
)
def test_every_blank_sentinel_is_no_value(value: float | int | str) -> None:
    assert is_blank(value)


@pytest.mark.parametrize("value", [0, 1, 0.0, 0.97, 2**40, 1e12, "GPU-1234", "<<<"])
def test_real_values_are_not_blank(value: float | int | str) -> None:
    assert not is_blank(value)


def test_a_record_with_an_error_status_or_no_timestamp_has_no_value() -> None:
    record = s.c_dcgmFieldValue_v2()
    record.fieldType, record.status, record.ts = s.FT_DOUBLE, 0, 1_700_000_000_000_000
    record.value.dbl = 0.5
    assert decode_value(record) == 0.5
    record.status = s.Return.NO_DATA
    assert decode_value(record) is None, "a per-record status is no value, whatever it holds"
    record.status, record.ts = 0, 0
    assert decode_value(record) is None, "ts = 0 is a record never filled"
    record.ts, record.value.dbl = 1, s.FP64_BLANK
    assert decode_value(record) is None


def test_a_missing_symbol_is_function_not_found_and_a_missing_library_library_not_found() -> None:
    with pytest.raises(DcgmError) as missing:
        DcgmLibrary(object()).init()
    assert missing.value.code == s.Return.FUNCTION_NOT_FOUND
    with pytest.raises(DcgmError) as absent:
        DcgmLibrary.load("libdcgm-not-installed-here.so.4")
    assert absent.value.code == s.Return.LIBRARY_NOT_FOUND


def test_calls_before_dcgm_init_answer_uninitialized() -> None:
    with fake_library("gpus: [{model: A100-SXM-80GB}]") as (node, _, _):
        fresh = DcgmLibrary(node.dcgm_library)
        node.dcgm.initialized = 0
        with pytest.raises(DcgmError) as error:
            fresh.connect("127.0.0.1", unix_socket=False, timeout_ms=10)
        assert error.value.name == "uninitialized"


def test_connect_checks_the_params_version() -> None:
    with fake_library("gpus: [{model: A100-SXM-80GB}]") as (node, _, _):
        params = s.c_dcgmConnectV2Params_v2()
        params.version = 0x03000010
        handle = s.c_dcgmHandle_t()
        code = node.dcgm_library.dcgmConnect_v2(
            b"127.0.0.1", ctypes.byref(params), ctypes.byref(handle)
        )
        assert code == s.Return.VER_MISMATCH


def test_gpu_ids_are_dcgms_own_and_map_to_nvml_by_uuid() -> None:
    with fake_library("gpus: [{model: A100-SXM-80GB}, {model: L40S}]") as (node, lib, _):
        handle = lib.connect("127.0.0.1:5555", unix_socket=False, timeout_ms=100)
        ids = lib.supported_gpus(handle)
        records = lib.latest_values(handle, [(1, i) for i in ids], [54], live=True)
        uuids = {r.entity_id: r.value for r in records}
        assert uuids[0] == node.gpus[1].uuid, "the fake numbers GPUs unlike NVML"
        assert uuids[1] == node.gpus[0].uuid


def test_mig_entities_follow_dcgms_id_formula_and_name_their_parent() -> None:
    scenario = "gpus: [{model: L40S}, {model: A100-SXM-80GB, mig: [3g.40gb, 1g.10gb]}]"
    with fake_library(scenario) as (node, lib, _):
        handle = lib.connect("127.0.0.1", unix_socket=False, timeout_ms=100)
        hierarchy = lib.mig_hierarchy(handle)
        instances = [e for e in hierarchy if e.entity_group == s.EntityGroup.GPU_I]
        computes = [e for e in hierarchy if e.entity_group == s.EntityGroup.GPU_CI]
        a100 = node.gpus[1]
        # The A100 is DCGM gpu 0 here: GPU_I ids are gpuId x maxGpcs + n [DcgmCacheManager.cpp].
        assert [e.entity_id for e in instances] == [0, 1]
        assert {e.parent_group for e in instances} == {s.EntityGroup.GPU}
        assert [e.nvml_instance_id for e in instances] == [
            m.spec.gpu_instance_id for m in a100.migs
        ]
        assert {e.gpu_uuid for e in hierarchy} == {a100.uuid}
        assert all(e.nvml_compute_instance_id == s.NO_COMPUTE_INSTANCE for e in instances)
        assert [(c.parent_group, c.parent_id) for c in computes] == [(4, 0), (4, 1)]


def test_a_field_group_name_is_unique_on_the_engine_across_connections() -> None:
    with fake_library("gpus: [{model: A100-SXM-80GB}]") as (_, lib, _):
        first = lib.connect("127.0.0.1", unix_socket=False, timeout_ms=100)
        second = lib.connect("127.0.0.1", unix_socket=False, timeout_ms=100)
        lib.field_group_create(first, [1002], "activity")
        with pytest.raises(DcgmError) as duplicate:
            lib.field_group_create(second, [1004], "activity")
        assert duplicate.value.name == "duplicate_key"
        lib.disconnect(first)  # its field groups go with it
        lib.field_group_create(second, [1004], "activity")


def _watched(
    lib: DcgmLibrary, handle: int, entities: list[tuple[int, int]], fields: list[int]
) -> int:
    group = lib.group_create(handle, f"g{len(entities)}{fields}")
    for entity in entities:
        lib.group_add_entity(handle, group, *entity)
    field_group = lib.field_group_create(handle, fields, f"f{len(entities)}{fields}")
    lib.watch_fields(handle, group, field_group, 1_000_000, 60.0)
    return group


def test_watches_are_all_or_nothing_and_unwatched_fields_read_blank() -> None:
    scenario = """
        gpus: [{model: A100-SXM-80GB}, {model: A100-SXM-80GB}]
        workloads: [{gpu: 0, pod: p, sm: 0.5}]
        timeline: [{at: 0s, type: dcgm_profiling, gpu: 1}]
    """
    with fake_library(scenario) as (_, lib, _):
        handle = lib.connect("127.0.0.1", unix_socket=False, timeout_ms=100)
        with pytest.raises(DcgmError) as in_use:
            _watched(lib, handle, [(1, 0), (1, 1)], [1002])
        assert in_use.value.name == "in_use"
        (record,) = lib.latest_values(handle, [(1, 1)], [1002])  # gpu 1 is NVML gpu 0
        assert record.status == s.Return.NOT_WATCHED, "the failed call watched nothing"
        assert (record.ts_us, record.value) == (0, None)


def test_a_first_sample_exists_as_the_watch_returns_and_then_one_per_interval() -> None:
    scenario = "gpus: [{model: L40S}]\nworkloads: [{gpu: 0, pod: p, sm: 0.25, tensor: 0.5}]"
    with fake_library(scenario) as (_, lib, clock):
        handle = lib.connect("127.0.0.1", unix_socket=False, timeout_ms=100)
        _watched(lib, handle, [(1, 0)], [1002, 1004])
        first = {r.field_id: r for r in lib.latest_values(handle, [(1, 0)], [1002, 1004])}
        assert first[1002].value == pytest.approx(0.25)
        assert first[1004].value == pytest.approx(0.5)
        clock.advance(0.5)
        again = lib.latest_values(handle, [(1, 0)], [1002])[0]
        assert again.ts_us == first[1002].ts_us, "no new sample within the interval"
        clock.advance(0.5)
        later = lib.latest_values(handle, [(1, 0)], [1002])[0]
        assert later.ts_us - first[1002].ts_us == 1_000_000


def test_fields_of_conflicting_passes_take_turns_and_read_blank_meanwhile() -> None:
    # V100 (invented table): SM activity and occupancy share majorId 0 with other minorIds.
    scenario = "gpus: [{model: V100-SXM2-32GB}]\nworkloads: [{gpu: 0, pod: p, sm: 0.5}]"
    with fake_library(scenario) as (_, lib, clock):
        handle = lib.connect("127.0.0.1", unix_socket=False, timeout_ms=100)
        _watched(lib, handle, [(1, 0)], [1002, 1003])
        seen: list[tuple[bool, bool]] = []
        for _ in range(4):
            values = {
                r.field_id: r.value for r in lib.latest_values(handle, [(1, 0)], [1002, 1003])
            }
            seen.append((values[1002] is not None, values[1003] is not None))
            clock.advance(1.0)
        assert seen == [(True, False), (False, True), (True, False), (False, True)]


def test_a_restarted_engine_invalidates_old_connections() -> None:
    with fake_library("gpus: [{model: A100-SXM-80GB}]") as (node, lib, clock):
        handle = lib.connect("127.0.0.1", unix_socket=False, timeout_ms=100)
        node.inject({"type": "dcgm_restart", "downtime": "5s"})
        with pytest.raises(DcgmError) as lost:
            lib.supported_gpus(handle)
        assert lost.value.name == "connection_not_valid"
        with pytest.raises(DcgmError):
            lib.connect("127.0.0.1", unix_socket=False, timeout_ms=100)  # still down
        clock.advance(5)
        assert lib.supported_gpus(lib.connect("127.0.0.1", unix_socket=False, timeout_ms=100))


def test_error_string_is_the_librarys_errorstring_symbol() -> None:
    with fake_library("gpus: [{model: A100-SXM-80GB}]") as (_, lib, _):
        assert lib.error_string(-21) == "Connection not valid"
