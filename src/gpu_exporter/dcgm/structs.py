"""DCGM's constants and C structs, as ctypes declarations (x86-64 / LP64).

Nothing here comes from a DCGM installation (there is none on PyPI or in Debian): every value is
transcribed from the headers of NVIDIA/DCGM v4.6.0 (commit 72fa3fe) as quoted, with line numbers,
in ``shared/reference/dcgm.md``. The citation next to each constant names the header and line.
``tests/dcgm/test_structs.py`` asserts the struct sizes and version words against that page.
"""

from __future__ import annotations

import ctypes
from enum import IntEnum

# The library name DCGM 4.x installs; 3.x was libdcgm.so.3 [go-dcgm pkg/dcgm/admin.go dlopen].
LIBRARY_NAME = "libdcgm.so.4"


class Return(IntEnum):
    """``dcgmReturn_t`` [dcgm_structs.h 344-416]. FUNCTION_NOT_FOUND is the Python bindings' own
    code for a symbol the library lacks [testing/python3/dcgm_structs.py 660-760]."""

    OK = 0
    BADPARAM = -1
    GENERIC_ERROR = -3
    MEMORY = -4
    NOT_CONFIGURED = -5
    NOT_SUPPORTED = -6
    INIT_ERROR = -7
    NVML_ERROR = -8
    UNINITIALIZED = -10
    TIMEOUT = -11
    VER_MISMATCH = -12
    UNKNOWN_FIELD = -13
    NO_DATA = -14
    STALE_DATA = -15
    NOT_WATCHED = -16
    NO_PERMISSION = -17
    GPU_IS_LOST = -18
    RESET_REQUIRED = -19
    FUNCTION_NOT_FOUND = -20
    CONNECTION_NOT_VALID = -21
    GPU_NOT_SUPPORTED = -22
    GROUP_INCOMPATIBLE = -23
    MAX_LIMIT = -24
    LIBRARY_NOT_FOUND = -25
    DUPLICATE_KEY = -26
    REQUIRES_ROOT = -29
    INSUFFICIENT_SIZE = -31
    FIELD_UNSUPPORTED_BY_API = -32
    MODULE_NOT_LOADED = -33
    IN_USE = -34
    GROUP_IS_EMPTY = -35
    PROFILING_NOT_SUPPORTED = -36
    PROFILING_LIBRARY_ERROR = -37
    PROFILING_MULTI_PASS = -38
    INSUFFICIENT_DRIVER_VERSION = -44
    INSTANCE_NOT_FOUND = -45
    COMPUTE_INSTANCE_NOT_FOUND = -46
    PAUSED = -54
    NVML_NOT_LOADED = -56
    GPUS_DETACHED = -67


def return_name(code: int) -> str:
    """``connection_not_valid`` for -21: the form the self-metrics' ``error`` label takes."""
    try:
        return Return(code).name.lower()
    except ValueError:
        return f"code_{code}"


class EntityGroup(IntEnum):
    """``dcgm_field_entity_group_t``, a 4-byte C enum [dcgm_fields.h 261-276]."""

    NONE = 0
    GPU = 1
    VGPU = 2
    SWITCH = 3
    GPU_I = 4
    GPU_CI = 5
    LINK = 6
    CPU = 7
    CPU_CORE = 8
    CONNECTX = 9


class GroupType(IntEnum):
    """``dcgmGroupType_t`` [dcgm_structs.h 436-456]."""

    DEFAULT = 0
    EMPTY = 1
    DEFAULT_NVSWITCHES = 2
    DEFAULT_INSTANCES = 3
    DEFAULT_COMPUTE_INSTANCES = 4
    DEFAULT_EVERYTHING = 5


# dcgmOperationMode_t [dcgm_structs.h 328]: AUTO = the engine's threads sample the watches.
OPERATION_MODE_AUTO = 1
OPERATION_MODE_MANUAL = 2
# The handle an embedded engine returns [dcgmlib/dcgm_test_apis.h 40; DcgmApi.cpp 6000-6021].
EMBEDDED_HANDLE = 0x7FFFFFFF
# nv-hostengine's default TCP port [dcgm_structs.h ~285-310 DCGM_HE_PORT_NUMBER].
DEFAULT_PORT = 5555
# UNIX_PREFIX ("unix://", the same header) is in target.py, which parses --dcgm.address.
# dcgmEntitiesGetLatestValues flags [dcgm_structs.h 2204]: read the driver now, not the cache.
FV_FLAG_LIVE_DATA = 0x1

# Sizes [dcgm_structs.h]: DCGM_MAX_STR_LENGTH, DCGM_MAX_BLOB_LENGTH, DCGM_MAX_NUM_DEVICES,
# DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP, DCGM_MAX_NUM_FIELD_GROUPS.
MAX_STR_LENGTH = 256
MAX_BLOB_LENGTH = 4096
MAX_NUM_DEVICES = 32
MAX_FIELD_IDS_PER_FIELD_GROUP = 128
MAX_NUM_FIELD_GROUPS = 64
MAX_NUM_GROUPS = 64  # DCGM_MAX_NUM_GROUPS [dcgmlib/src/DcgmGroupManager.inl 247-250]
# Profiling metric groups per request [dcgm_structs.h 4198-4250] and ids per group.
PROF_MAX_NUM_GROUPS_V2 = 10
PROF_MAX_FIELD_IDS_PER_GROUP_V2 = 64
# MIG hierarchy capacity: 32 GPUs x 14 entities [dcgm_structs.h 750-806].
MAX_HIERARCHY_INFO = 448
MIG_UUID_LENGTH = 128
NO_COMPUTE_INSTANCE = (
    0xFFFFFFFF  # a GPU_I record's nvmlComputeInstanceId [DcgmCacheManager.cpp 16097-16170]
)


class Field(IntEnum):
    """Field ids [dcgm_fields.h]; 4.6.0 names in comments where they were renamed (the old names
    stay as aliases, and dcgm-exporter's CSVs still use them) [dcgm_fields.h 3602-3830]."""

    DEV_GPU_UUID = 54  # string
    PROF_GR_ENGINE_ACTIVE = 1001  # PROF_GR_ENGINE_UTIL_RATIO; double, GPU_CI level
    PROF_SM_ACTIVE = 1002  # PROF_SM_UTIL_RATIO; double, GPU_CI
    PROF_SM_OCCUPANCY = 1003  # PROF_SM_OCCUPANCY_RATIO; double, GPU_CI
    PROF_PIPE_TENSOR_ACTIVE = 1004  # PROF_TENSOR_UTIL_RATIO; double, GPU_CI
    PROF_DRAM_ACTIVE = 1005  # PROF_DRAM_UTIL_RATIO; double, GPU_I level
    PROF_PIPE_FP64_ACTIVE = 1006  # PROF_FP64_UTIL_RATIO
    PROF_PIPE_FP32_ACTIVE = 1007  # PROF_FP32_UTIL_RATIO
    PROF_PIPE_FP16_ACTIVE = 1008  # PROF_FP16_UTIL_RATIO (excludes HMMA)


# Profiling (DCP) fields are 1000 <= id < 1100 [dcgm-exporter internal/pkg/counters/const.go].
PROF_FIELD_RANGE = range(1000, 1100)

# Field types: one-byte chars stored in fieldType [dcgm_fields.h 30-58].
FT_BINARY = ord("b")
FT_DOUBLE = ord("d")
FT_INT64 = ord("i")
FT_STRING = ord("s")
FT_TIMESTAMP = ord("t")

# Blank values [dcgm_structs.h 43-158]: a value at or above the BLANK marker means "no value"
# (DCGM_INT64_IS_BLANK(v) = v >= DCGM_INT64_BLANK; the same for INT32 and FP64).
INT32_BLANK = 0x7FFFFFF0
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0  # 2^47
STR_BLANK = "<<<NULL>>>"
STR_NOT_FOUND = "<<<NOT_FOUND>>>"
STR_NOT_SUPPORTED = "<<<NOT_SUPPORTED>>>"
STR_NOT_PERMISSIONED = "<<<NOT_PERM>>>"


def make_version(struct: type[ctypes.Structure], version: int) -> int:
    """``MAKE_DCGM_VERSION(type, ver) = sizeof(type) | (ver << 24)`` [dcgm_structs.h 37]."""
    return ctypes.sizeof(struct) | (version << 24)


# Handles and group ids: ``typedef uintptr_t dcgmHandle_t, dcgmGpuGrp_t, dcgmFieldGrp_t``, passed
# by value [dcgm_structs.h 512]. uintptr_t is 64 bits on LP64.
c_dcgmHandle_t = ctypes.c_uint64
c_dcgmGpuGrp_t = ctypes.c_uint64
c_dcgmFieldGrp_t = ctypes.c_uint64


class c_dcgmFieldValueUnion(ctypes.Union):
    """``union { int64_t i64; double dbl; char str[256]; char blob[4096]; }`` (4096, 8-aligned)
    [dcgm_structs.h 2170-2195]."""

    _fields_ = [
        ("i64", ctypes.c_int64),
        ("dbl", ctypes.c_double),
        ("str", ctypes.c_char * MAX_STR_LENGTH),
        ("blob", ctypes.c_byte * MAX_BLOB_LENGTH),
    ]


class c_dcgmFieldValue_v1(ctypes.Structure):
    """4120 B: version@0, fieldId@4, fieldType@6, status@8, pad, ts@16, value@24
    [dcgm_structs.h 2145-2167]."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("fieldId", ctypes.c_ushort),
        ("fieldType", ctypes.c_ushort),
        ("status", ctypes.c_int),
        ("ts", ctypes.c_int64),
        ("value", c_dcgmFieldValueUnion),
    ]


class c_dcgmFieldValue_v2(ctypes.Structure):
    """4128 B [dcgm_structs.h 2170-2195]. ``ts`` is microseconds since 1970 on the engine's wall
    clock; ``status`` is the record's own dcgmReturn_t (a failed read does not fail the call)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("entityGroupId", ctypes.c_int),  # dcgm_field_entity_group_t (a 4-byte enum)
        ("entityId", ctypes.c_uint),
        ("fieldId", ctypes.c_ushort),
        ("fieldType", ctypes.c_ushort),  # a char code; the Python bindings declare c_short
        ("status", ctypes.c_int),
        ("unused", ctypes.c_uint),  # aligns ts
        ("ts", ctypes.c_int64),
        ("value", c_dcgmFieldValueUnion),
    ]


class c_dcgmGroupEntityPair_t(ctypes.Structure):
    """``{entityGroupId (enum, 4), entityId (uint)}`` = 8 B [dcgm_structs.h]."""

    _fields_ = [("entityGroupId", ctypes.c_int), ("entityId", ctypes.c_uint)]


class c_dcgmConnectV2Params_v1(ctypes.Structure):
    """The first two fields of v2 (8 B) [dcgm_structs.h 560-633]."""

    _fields_ = [("version", ctypes.c_uint), ("persistAfterDisconnect", ctypes.c_uint)]


class c_dcgmConnectV2Params_v2(ctypes.Structure):
    """16 B, in this order [dcgm_structs.h 560-633]. ``timeoutMs=0`` means 5000 ms
    [DcgmClientHandler.cpp 222-284]; ``persistAfterDisconnect=0``: the engine drops this
    connection's watches when it goes [dcgm_structs.h 566-604]."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("persistAfterDisconnect", ctypes.c_uint),
        ("timeoutMs", ctypes.c_uint),
        ("addressIsUnixSocket", ctypes.c_uint),
    ]


class c_dcgmProfMetricGroupInfo_v2(ctypes.Structure):
    """``{ushort majorId; ushort minorId; uint numFieldIds; ushort fieldIds[64]}`` (136 B)
    [dcgm_structs.h 4198-4250]. Same majorId, different minorId: separate hardware passes."""

    _fields_ = [
        ("majorId", ctypes.c_ushort),
        ("minorId", ctypes.c_ushort),
        ("numFieldIds", ctypes.c_uint),
        ("fieldIds", ctypes.c_ushort * PROF_MAX_FIELD_IDS_PER_GROUP_V2),
    ]


class c_dcgmProfGetMetricGroups_v3(ctypes.Structure):
    """1376 B; the only version ``dcgmProfGetSupportedMetricGroups`` accepts
    [dcgm_structs.h 4198-4250]. The caller sets ``version`` and ``gpuId``."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("unused", ctypes.c_uint),
        ("gpuId", ctypes.c_uint),
        ("numMetricGroups", ctypes.c_uint),
        ("metricGroups", c_dcgmProfMetricGroupInfo_v2 * PROF_MAX_NUM_GROUPS_V2),
    ]


class c_dcgmMigEntityInfo_t(ctypes.Structure):
    """148 B [dcgm_structs.h 750-806]; ``gpuUuid`` is the parent GPU's UUID."""

    _fields_ = [
        ("gpuUuid", ctypes.c_char * MIG_UUID_LENGTH),
        ("nvmlGpuIndex", ctypes.c_uint),
        ("nvmlInstanceId", ctypes.c_uint),
        ("nvmlComputeInstanceId", ctypes.c_uint),
        ("nvmlMigProfileId", ctypes.c_uint),
        ("nvmlProfileSlices", ctypes.c_uint),
    ]


class c_dcgmMigHierarchyInfo_v2(ctypes.Structure):
    """``{entity; parent; info}`` (164 B) [dcgm_structs.h 750-806]."""

    _fields_ = [
        ("entity", c_dcgmGroupEntityPair_t),
        ("parent", c_dcgmGroupEntityPair_t),
        ("info", c_dcgmMigEntityInfo_t),
    ]


class c_dcgmMigHierarchy_v2(ctypes.Structure):
    """``{uint version; uint count; entityList[448]}`` (73480 B) [dcgm_structs.h 750-806]."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("count", ctypes.c_uint),
        ("entityList", c_dcgmMigHierarchyInfo_v2 * MAX_HIERARCHY_INFO),
    ]


# Version words [dcgm_structs.h 37 and the *_version defines]; asserted in tests against
# reference/dcgm.md's table.
FIELD_VALUE_VERSION_1 = make_version(c_dcgmFieldValue_v1, 1)
FIELD_VALUE_VERSION_2 = make_version(c_dcgmFieldValue_v2, 2)
CONNECT_V2_PARAMS_VERSION_1 = make_version(c_dcgmConnectV2Params_v1, 1)
CONNECT_V2_PARAMS_VERSION = make_version(c_dcgmConnectV2Params_v2, 2)  # dcgmConnectV2Params_version
PROF_GET_METRIC_GROUPS_VERSION = make_version(c_dcgmProfGetMetricGroups_v3, 3)
MIG_HIERARCHY_VERSION = make_version(c_dcgmMigHierarchy_v2, 2)
