"""The one place that knows NVML's error kinds and what each means for the exporter.

- NotSupported / FunctionNotFound: the device (or driver) lacks the signal. Omit the series,
  remember it per device so the call is never repeated, and log it once.
- NoPermission from a device call: the exporter lacks the privilege that call needs (root), which
  does not change while it runs: remembered and logged once like NotSupported.
- GpuIsLost (and ResetRequired): the device is gone. Raise :class:`DeviceLost` so the sampler
  marks that GPU down and re-probes it with backoff, while every other GPU carries on.
- NotFound: "no data right now" for the calls that use it (empty MIG slots, no process samples).
- Any other NVML error: count it in ``gpu_exporter_nvml_errors_total{function,error}``, omit that
  one series, and mark the collector failed for this sample (logged, rate-limited, by the sampler).
- Anything that is not an NVML error (a wrong-arity call, a typo in a collector) is not caught:
  it propagates to the sampler's collector failure path, which logs its traceback once per
  (collector, exception type). Programming errors stay loud and fail the tests.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from typing import Any

import pynvml

# Classified by NVML return code, which is stable across pynvml versions (class names are not).
_NOT_SUPPORTED = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
_LOST = frozenset({pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED})
_NOT_FOUND: int = pynvml.NVML_ERROR_NOT_FOUND
_NO_PERMISSION: int = pynvml.NVML_ERROR_NO_PERMISSION
_VERSION_REFUSED: int = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
# Codes that mean "the library or driver is not there", as opposed to a failing device.
_UNAVAILABLE = frozenset(
    {
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)


# What the boundary catches: NVML's errors, and pynvml's "the loaded library lacks this
# versioned symbol" (a plain Exception subclass). Anything else is a bug and propagates.
_MISMATCH: type[Exception] | None = getattr(pynvml, "NVMLLibraryMismatchError", None)
NVML_ERRORS: tuple[type[Exception], ...] = (
    (pynvml.NVMLError,) if _MISMATCH is None else (pynvml.NVMLError, _MISMATCH)
)


def nvml_code(exc: BaseException) -> int | None:
    if not isinstance(exc, pynvml.NVMLError):
        return None
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine at all (no library, no driver)."""


class DeviceLost(RuntimeError):
    """A GPU stopped answering (GpuIsLost): only that GPU's series are affected."""

    def __init__(self, uuid: str, function: str) -> None:
        super().__init__(f"GPU {uuid} is lost (in {function})")
        self.uuid = uuid
        self.function = function


def is_not_supported(exc: BaseException) -> bool:
    # A versioned symbol the loaded library lacks (pynvml raises a plain Exception for it) means,
    # like FunctionNotFound, that this driver does not have the function.
    if _MISMATCH is not None and isinstance(exc, _MISMATCH):
        return True
    return nvml_code(exc) in _NOT_SUPPORTED


def is_no_permission(exc: BaseException) -> bool:
    return nvml_code(exc) == _NO_PERMISSION


def is_version_refused(exc: BaseException) -> bool:
    """ArgumentVersionMismatch: the driver has the function but not the struct version sent."""
    return nvml_code(exc) == _VERSION_REFUSED


def is_lost(exc: BaseException) -> bool:
    return nvml_code(exc) in _LOST


def is_not_found(exc: BaseException) -> bool:
    return nvml_code(exc) == _NOT_FOUND


def is_unavailable(exc: BaseException) -> bool:
    return nvml_code(exc) in _UNAVAILABLE


# CamelCase word boundaries, acronyms kept whole: NVMLLibraryMismatch -> NVML_Library_Mismatch.
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def error_name(exc: BaseException) -> str:
    """A stable snake_case label for an error: NVMLError_GpuIsLost -> gpu_is_lost."""
    if isinstance(exc, pynvml.NVMLError):
        name = type(exc).__name__.removeprefix("NVMLError_")
        if name == "NVMLError":  # a code pynvml has no subclass for
            return f"code_{getattr(exc, 'value', 'unknown')}"
        return _CAMEL.sub("_", name).lower()
    return _CAMEL.sub("_", type(exc).__name__).lower()


class ErrorCounter:
    """Thread-safe ``(function, error) -> count``, read by the self-metrics collector."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, function: str, error: str) -> None:
        with self._lock:
            self._counts[(function, error)] += 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


def value_of(obj: Any) -> Any:
    """ctypes scalars and plain ints alike."""
    return getattr(obj, "value", obj)
