"""DCGM: a ctypes binding of the calls the activity source needs, and that source's engine side.

``library`` is the binding (one swappable library object, as pynvml has for libnvidia-ml);
``structs`` its constants and C layouts, each cited to DCGM's headers; ``session`` what one
connection to a host engine watches and reads; ``service`` the event-loop side that keeps a
session up (connect, reconnect with backoff, bounded calls on worker threads).
"""

from .library import DcgmError, DcgmLibrary, FieldValue, MetricGroup, MigEntity

__all__ = ["DcgmError", "DcgmLibrary", "FieldValue", "MetricGroup", "MigEntity"]
