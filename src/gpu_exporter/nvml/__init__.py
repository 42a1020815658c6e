"""The NVML boundary for sampling: every collector's NVML call goes through ``DeviceCalls``.

``calls.py`` runs a call and maps NVML's errors to counted outcomes (unsupported, lost, other);
anything that is not an NVML error propagates, so a programming error stays loud;
``errors.py`` names NVML's error codes; ``pool.py`` is the worker pool that keeps blocking NVML
calls off the event loop. Not here: the NVML event thread for Xids (``xid/nvml_events.py``)
handles its own NVML errors (logged, the thread restarted), and device discovery
(``devices.py``) asks a few system-level functions directly.
"""

from .calls import DeviceCalls, FieldValue, SupportRegistry
from .errors import DeviceLost, ErrorCounter, NvmlUnavailable, error_name, value_of
from .pool import CallTimedOut, PoolExhausted, WorkerPool

__all__ = [
    "CallTimedOut",
    "DeviceCalls",
    "DeviceLost",
    "ErrorCounter",
    "FieldValue",
    "NvmlUnavailable",
    "PoolExhausted",
    "SupportRegistry",
    "WorkerPool",
    "error_name",
    "value_of",
]
