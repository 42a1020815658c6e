"""Helpers shared by the fake NVML functions: argument access and device lookup.

pynvml calls the fake functions with exactly the ctypes objects it builds: ``byref(x)`` arrives as
a ``CArgObject`` whose ``_obj`` is ``x``; scalars arrive as ``c_uint``-like objects or plain ints;
string buffers arrive as ``c_char`` arrays; NULL arrives as ``None``.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from gpu_exporter.simulator.devices import Device, GpuDevice, MigDevice
from gpu_exporter.simulator.errors import NvmlFailure

if TYPE_CHECKING:
    from gpu_exporter.simulator.nodeview import NodeView

SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999


def out(ref: Any) -> Any:
    """The object behind ``byref(obj)`` (or the object itself when passed directly)."""
    if ref is None:
        raise NvmlFailure(INVALID_ARGUMENT)
    return getattr(ref, "_obj", ref)


def val(arg: Any) -> Any:
    """The Python value of a ctypes scalar or a plain int."""
    return getattr(arg, "value", arg)


def write_text(buffer: Any, length: Any, text: str) -> int:
    """Fill a ``create_string_buffer`` the way NVML does, including the size check."""
    data = text.encode()
    if buffer is None or len(data) + 1 > int(val(length)):
        raise NvmlFailure(INSUFFICIENT_SIZE)
    buffer.value = data
    return SUCCESS


class FunctionsBase:
    """Device resolution with NVML's errors: unknown handle, lost GPU, MIG restrictions."""

    def __init__(self, node: NodeView) -> None:
        self.node = node

    def device(self, handle: Any) -> Device:
        """Any device (GPU or MIG); GpuIsLost when its GPU has fallen off the bus."""
        device = self.node.device_of(handle)
        if device is None:
            raise NvmlFailure(INVALID_ARGUMENT)
        if device.gpu.lost:
            raise NvmlFailure(GPU_IS_LOST)
        return device

    def gpu(self, handle: Any) -> GpuDevice:
        """A whole-GPU handle; MIG handles get NotSupported (power, clocks, ECC, ...)."""
        device = self.device(handle)
        if isinstance(device, MigDevice):
            raise NvmlFailure(NOT_SUPPORTED)
        return device

    def now(self) -> float:
        return self.node.now()

    def point(self, ref: Any, target: ctypes.Structure) -> None:
        """Make the pointer behind ``byref(pointer)`` point at ``target`` (an opaque handle).

        Only the address is written, as the C library writes it: ``pointer.contents = target``
        would also hang a dict keeping ``target`` alive on every handle the caller gets. The node
        keeps ``target`` alive instead, as the library owns the memory its handles point at."""
        self.node.pointed_at[ctypes.addressof(target)] = target
        ctypes.c_void_p.from_buffer(out(ref)).value = ctypes.addressof(target)

    def release(self, target: ctypes.Structure) -> None:
        """The library frees what a handle pointed at (an event set, a GPM sample)."""
        self.node.pointed_at.pop(ctypes.addressof(target), None)

    def privileged_parent(self, device: Device) -> None:
        """Aggregate queries on a MIG-enabled GPU need root (nvml.h: "only if the caller has
        appropriate privileges"); the code a non-root caller gets is assumed NO_PERMISSION."""
        privileged = self.node.scenario.node.privileged
        if isinstance(device, GpuDevice) and device.mig_enabled and not privileged:
            raise NvmlFailure(NO_PERMISSION)
