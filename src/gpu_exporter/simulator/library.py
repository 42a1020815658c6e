"""The fake ``libnvidia-ml``: an object whose attributes are NVML's C functions.

Each attribute is a plain function (pynvml sets ``restype`` on some, which a bound method would
refuse) that returns an ``nvmlReturn_t`` int and never raises: an unexpected exception becomes
NVML_ERROR_UNKNOWN (999) and is logged, as a C library cannot raise into Python.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpu_exporter.simulator.coverage import (
    constant_function,
    constants_table,
    not_supported_function,
    not_supported_table,
)
from gpu_exporter.simulator.errors import NvmlFailure
from gpu_exporter.simulator.nvml_base import UNINITIALIZED, UNKNOWN
from gpu_exporter.simulator.nvml_device_info import DeviceInfoFunctions
from gpu_exporter.simulator.nvml_gpm_events import GpmEventFunctions
from gpu_exporter.simulator.nvml_identity import IdentityFunctions
from gpu_exporter.simulator.nvml_interconnect import InterconnectFunctions
from gpu_exporter.simulator.nvml_processes import ProcessFunctions
from gpu_exporter.simulator.nvml_telemetry import TelemetryFunctions
from gpu_exporter.simulator.nvml_topology import TopologyFunctions

if TYPE_CHECKING:
    from gpu_exporter.simulator.nodeview import NodeView

log = logging.getLogger(__name__)

ERROR_STRINGS = {
    0: "Success",
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    5: "Already Initialized",
    6: "Not Found",
    7: "Insufficient Size",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    15: "GPU is lost",
    25: "Argument version mismatch",
    29: "Invalid state",
    999: "Unknown Error",
}
# Functions usable before nvmlInit, and those that block and so must not hold the node lock.
NO_INIT = frozenset({"nvmlInitWithFlags", "nvmlInit_v2"})
UNLOCKED = frozenset({"nvmlEventSetWait_v2"})


class NvmlFunctions(
    IdentityFunctions,
    TelemetryFunctions,
    GpmEventFunctions,
    InterconnectFunctions,
    ProcessFunctions,
    DeviceInfoFunctions,
    TopologyFunctions,
):
    """All implemented NVML functions; method names are the C symbols pynvml looks up."""


METHODS = frozenset(
    name for name in dir(NvmlFunctions) if name.startswith("nvml") and not name.startswith("_")
)
# Functions that answer one constant (data/nvml_constants.tsv), unless a method implements them.
CONSTANTS = frozenset(constants_table()) - METHODS
IMPLEMENTED = METHODS | CONSTANTS | {"nvmlErrorString"}
# Everything else pynvml wraps answers NotSupported (data/nvml_not_supported.tsv says why).
NOT_SUPPORTED_FUNCTIONS = frozenset(not_supported_table()) - IMPLEMENTED
C_FUNCTIONS = IMPLEMENTED | NOT_SUPPORTED_FUNCTIONS


def nvml_error_string(result: Any) -> bytes:
    code = int(getattr(result, "value", result))
    return ERROR_STRINGS.get(code, f"Unknown Error ({code})").encode()


class FakeNvmlLibrary:
    """Stands in for ``CDLL("libnvidia-ml.so.1")``; see :func:`gpu_exporter.simulator.install`."""

    def __init__(self, node: NodeView) -> None:
        self.node = node
        functions = NvmlFunctions(node)
        for name in METHODS:
            setattr(self, name, _entry_point(node, name, getattr(functions, name)))
        for name in CONSTANTS:
            answer = constant_function(node.device_of, constants_table()[name])
            setattr(self, name, _entry_point(node, name, answer))
        for name in NOT_SUPPORTED_FUNCTIONS:
            setattr(self, name, _entry_point(node, name, not_supported_function(node.device_of)))
        self.nvmlErrorString = _plain(nvml_error_string)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        # Only reached for functions the simulator lacks: pynvml turns this into
        # NVMLError_FunctionNotFound, as with a real library missing a symbol.
        raise AttributeError(name)


def _plain(function: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """A fresh function object, so pynvml setting ``restype`` on it touches nothing shared."""

    def nvmlErrorString(result: Any) -> bytes:
        return function(result)

    return nvmlErrorString


def _entry_point(node: NodeView, name: str, method: Callable[..., int]) -> Callable[..., int]:
    def entry(*args: Any) -> int:
        try:
            return _call(node, name, method, args)
        except NvmlFailure as failure:
            return failure.code
        except Exception:
            log.exception("simulated %s failed", name)
            return UNKNOWN

    entry.__name__ = entry.__qualname__ = name
    return entry


def _call(node: NodeView, name: str, method: Callable[..., int], args: tuple[Any, ...]) -> int:
    if name not in NO_INIT and node.init_count == 0:
        return UNINITIALIZED
    node.calls[name] += 1  # lets tests check what the exporter asks, and how often
    node.advance(integrate=False)
    _wait_if_hung(node, name, args)
    if node.failures:
        failure = node.failure_for(name, _gpu_index(node, name, args))
        if failure is not None:
            return failure
    if name in UNLOCKED:
        return method(*args)
    with node.lock:
        return method(*args)


def _wait_if_hung(node: NodeView, name: str, args: tuple[Any, ...]) -> None:
    if not node.hangs:  # the usual case, and every call asks
        return
    hang = node.hang_for(name, _gpu_index(node, name, args))
    if hang is not None:
        hang.released.wait(hang.remaining())


def _gpu_index(node: NodeView, name: str, args: tuple[Any, ...]) -> int | None:
    """Which GPU a call concerns (for hangs scoped to one GPU), if any."""
    if not args:
        return None
    if name == "nvmlDeviceGetHandleByIndex_v2":
        return int(getattr(args[0], "value", args[0]))
    device = node.device_of(args[0])
    return device.gpu.index if device is not None else None
