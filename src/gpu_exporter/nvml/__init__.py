"""Everything that touches NVML error semantics and threads lives in this package."""

from .calls import DeviceCalls, SupportRegistry
from .errors import DeviceLost, ErrorCounter, NvmlUnavailable, error_name, value_of
from .pool import PoolExhausted, WorkerPool

__all__ = [
    "DeviceCalls",
    "DeviceLost",
    "ErrorCounter",
    "NvmlUnavailable",
    "PoolExhausted",
    "SupportRegistry",
    "WorkerPool",
    "error_name",
    "value_of",
]
