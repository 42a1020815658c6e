"""A collector's handle on NVML for one device: every call goes through :meth:`DeviceCalls.get`."""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from typing import Any, NamedTuple, TypeVar

import pynvml

from ..logs import get_logger
from .errors import (
    NVML_ERRORS,
    DeviceLost,
    ErrorCounter,
    error_name,
    is_lost,
    is_no_permission,
    is_not_found,
    is_not_supported,
    is_version_refused,
)

T = TypeVar("T")
_log = get_logger("nvml")


class SupportRegistry:
    """Which signals each device lacks, learnt from NotSupported once and never asked again.

    Keyed by device UUID (NVML handles are unhashable pointers). Cleared for a device when it
    comes back from being lost, since a reset or a new driver may change what it supports.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unsupported: dict[str, set[str]] = {}
        self._announced: set[str] = set()

    def is_unsupported(self, uuid: str, signal: str) -> bool:
        with self._lock:
            return signal in self._unsupported.get(uuid, ())

    def mark_unsupported(self, uuid: str, signal: str) -> bool:
        """Record a NotSupported signal; True the first time *any* device lacks it.

        The caller logs it then: eight identical GPUs lacking a signal make one log line.
        """
        with self._lock:
            self._unsupported.setdefault(uuid, set()).add(signal)
            if signal in self._announced:
                return False
            self._announced.add(signal)
            return True

    def unsupported(self, uuid: str) -> frozenset[str]:
        with self._lock:
            return frozenset(self._unsupported.get(uuid, ()))

    def forget(self, uuid: str) -> None:
        with self._lock:
            self._unsupported.pop(uuid, None)


class DeviceCalls:
    """NVML calls for one device during one collector run, classified by error kind (see errors).

    Used on a worker thread. ``current_function`` names the call in progress, so when the sampler
    gives up on a hung job it can say which NVML function hung.
    """

    def __init__(
        self,
        uuid: str,
        support: SupportRegistry,
        errors: ErrorCounter,
        *,
        collector: str,
        lost_uuid: str | None = None,
    ) -> None:
        self.uuid = uuid
        self.collector = collector
        self._lost_uuid = lost_uuid or uuid  # a MIG instance is lost with its parent GPU
        self._support = support
        self._errors = errors
        self.current_function: str | None = None
        self.failures: list[tuple[str, str]] = []

    def lacks(self, signal: str) -> bool:
        """True once the device answered NotSupported for ``signal`` (e.g. ``field91``)."""
        return self._support.is_unsupported(self.uuid, signal)

    def get(
        self,
        fn: Callable[..., T],
        *args: Any,
        signal: str | None = None,
        explain: str | None = None,
        quiet: bool = False,
    ) -> T | None:
        """Call ``fn(*args)``; None when the device lacks the signal or has no data right now.

        ``signal`` names the capability for the NotSupported memory when one function serves
        several (e.g. ECC counters by error and counter type); it defaults to the function name.
        ``explain`` is added to the one log line when the signal is found NotSupported or
        FunctionNotFound: what the answer can also mean and what is lost (a versioned struct
        the driver does not take). NoPermission always says that privileges are missing.
        ``quiet``: a NotSupported answer is expected for some of many probes (a profile table
        scan) and remembered without a log line.
        """
        function = fn.__name__
        key = signal or function
        if self._support.is_unsupported(self.uuid, key):
            return None
        self.current_function = function
        try:
            return fn(*args)
        except NVML_ERRORS as exc:
            self._handle(exc, function, key, explain, quiet)
            return None
        finally:
            self.current_function = None

    def _handle(
        self,
        exc: Exception,
        function: str,
        key: str,
        explain: str | None = None,
        quiet: bool = False,
    ) -> None:
        """Classify an NVML error: remember NotSupported, raise DeviceLost, count the rest."""
        if is_not_supported(exc):
            if quiet:
                self._support.mark_unsupported(self.uuid, key)
            else:
                self._mark_unsupported(key, exc, explain)
            return
        if is_no_permission(exc):
            self._mark_unsupported(key, exc, _NO_PERMISSION_EXPLAINED)
            return
        if is_version_refused(exc):  # holds until the driver changes, as NotSupported does
            self._mark_unsupported(key, exc, explain or _VERSION_REFUSED_EXPLAINED)
            return
        if is_lost(exc):
            self._errors.add(function, error_name(exc))
            raise DeviceLost(self._lost_uuid, function) from exc
        if is_not_found(exc):
            return
        # Unexpected: omit this one series, keep the collector's other signals for the device,
        # and let the sampler mark the collector failed and log it (rate-limited).
        self._errors.add(function, error_name(exc))
        self.failures.append((function, error_name(exc)))

    def field_values(self, handle: Any, request: FieldRequest) -> dict[FieldKey, FieldValue]:
        """Read NVML field values; fields the device lacks are remembered and not asked again.

        A key is a field id, or ``(field id, scope id)`` for a field that needs a scope (an NVLink
        link); the :class:`FieldRequest` holds them, prepared once and reused round after round.
        ``nvmlDeviceGetFieldValues`` succeeds when any field was filled, so each value's own
        ``nvmlReturn`` is checked and its union member read according to ``valueType``; values
        come back in request order, so each is filed under the key it was asked by. A per-field
        NotSupported, FunctionNotFound or InvalidArgument (what a driver whose header predates
        the id may answer: unverified) marks that one field unsupported for the device.
        """
        lacking = self._support.unsupported(self.uuid)
        if lacking and any(field_signal(key) in lacking for key in request.keys):
            request = FieldRequest([k for k in request.keys if field_signal(k) not in lacking])
        if not request.keys:
            return {}
        values = self.get(nvmlDeviceGetFieldValues, handle, request, signal="field_values")
        result: dict[FieldKey, FieldValue] = {}
        for key, (code, number, kind, stamp) in zip(request.keys, _decode(values), strict=False):
            if code == pynvml.NVML_SUCCESS:
                result[key] = FieldValue(number, kind, stamp)
            elif code in _FIELD_UNSUPPORTED:
                self._mark_unsupported(field_signal(key), pynvml.NVMLError(code))
            elif code != pynvml.NVML_ERROR_NOT_FOUND:
                self._handle(pynvml.NVMLError(code), "nvmlDeviceGetFieldValues", field_signal(key))
        return result

    def _mark_unsupported(self, key: str, exc: Exception, explain: str | None = None) -> None:
        if self._support.mark_unsupported(self.uuid, key):
            extra = {"why": explain} if explain else {}
            _log.info(
                "signal not supported; its series are omitted where unsupported",
                uuid=self.uuid,
                signal=key,
                collector=self.collector,
                error=error_name(exc),
                **extra,
            )


_NO_PERMISSION_EXPLAINED = (
    "this call needs privileges the exporter lacks (root or CAP_SYS_ADMIN), which do not change "
    "while it runs; docs/deploy.md lists what a non-root deployment loses"
)
_VERSION_REFUSED_EXPLAINED = (
    "the driver has this function but does not take the struct version the binding sends "
    "(nvidia-ml-py newer or older than the driver); asked again only after the driver changes"
)


class FieldValue(NamedTuple):
    """One field as NVML answered it: the number, its ``nvmlValueType_t`` and its timestamp (us).

    A named tuple, not a dataclass: a batch builds dozens per device and round."""

    value: float
    value_type: int
    timestamp_us: int


# Per-field answers that mean "this device or driver does not have the field": remembered.
_FIELD_UNSUPPORTED = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
    }
)


# A field id, or (field id, scope id) for fields read per link or per scope.
FieldKey = int | tuple[int, int]


class FieldRequest:
    """The ``c_nvmlFieldValue_t`` array for a fixed list of keys, built once and reused.

    pynvml's wrapper builds the array on every call, with two Python-level struct writes per
    field (about 40 per GPU and round). NVML reads only ``fieldId`` and ``scopeId`` and writes
    the rest, so one array serves every round of a batch whose fields do not change."""

    __slots__ = ("keys", "values")

    def __init__(self, keys: Sequence[FieldKey]) -> None:
        self.keys: tuple[FieldKey, ...] = tuple(keys)
        self.values = (pynvml.c_nvmlFieldValue_t * len(self.keys))()
        for slot, key in zip(self.values, self.keys, strict=True):
            slot.fieldId, slot.scopeId = _scoped(key)


def nvmlDeviceGetFieldValues(handle: Any, request: FieldRequest) -> Any:
    """``pynvml.nvmlDeviceGetFieldValues`` on a prepared array (named as the C function, for the
    error counts and the hung-call report). It takes the C function as pynvml's own wrappers do,
    through ``_nvmlGetFunctionPointer`` (private, but the loader every wrapper in nvidia-ml-py has
    used since its first release; the image pins the version)."""
    function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    answer = function(handle, ctypes.c_int32(len(request.keys)), ctypes.byref(request.values))
    if answer != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(answer)
    return request.values


def _scoped(key: FieldKey) -> tuple[int, int]:
    return key if isinstance(key, tuple) else (key, 0)  # scope 0: NVML's default


@cache
def field_signal(key: FieldKey) -> str:
    """The NotSupported memory's name for a field: ``field94``. A scoped field (per link) is one
    signal for all its scopes: a device without NVLink5 counters lacks them on every link."""
    return f"field{key[0] if isinstance(key, tuple) else key}"


# c_nvmlFieldValue_t as bytes: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn,
# the 8-byte value union. Unpacking the array's bytes at once costs a fraction of reading each
# struct member through ctypes (docs/performance.md); the layout is checked against ctypes first.
_FIELD_LAYOUT = struct.Struct("=IIqqII8s")
# nvmlValueType_t -> the union member's format, read from the start of the 8 bytes.
_VALUE_FORMATS = {
    0: struct.Struct("=d"),
    1: struct.Struct("=I"),
    2: struct.Struct("=Q"),
    3: struct.Struct("=Q"),
    4: struct.Struct("=q"),
    5: struct.Struct("=i"),
    6: struct.Struct("=H"),
}


def _decode(values: Any) -> Iterator[tuple[int, float, int, int]]:
    """(nvmlReturn, number, valueType, timestamp) of each filled c_nvmlFieldValue_t."""
    if not values:
        return
    if ctypes.sizeof(pynvml.c_nvmlFieldValue_t) != _FIELD_LAYOUT.size:
        for value in values:  # a pynvml whose struct differs: read it member by member
            yield int(value.nvmlReturn), _field_number(value), int(value.valueType), value.timestamp
        return
    for _, _, stamp, _, kind, code, raw in _FIELD_LAYOUT.iter_unpack(bytes(values)):
        number = _VALUE_FORMATS.get(kind, _VALUE_FORMATS[3]).unpack_from(raw)[0]
        yield code, float(number), kind, stamp


def _field_number(value: Any) -> float:
    member = _VALUE_MEMBERS.get(int(value.valueType), "ullVal")
    return float(getattr(value.value, member))


# nvmlValueType_t -> the c_nvmlValue_t union member that holds it.
_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}
