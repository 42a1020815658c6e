"""Xids: captured from NVML events and the kernel log, classified, attributed, persisted, counted.

See docs/xid.md. The exporter wires :class:`XidSubsystem` into the sampler as a sample source and
a device listener.
"""

from .classes import Classifier, XidClassesError, load_classifier
from .core import HolderLookup, Observation, XidCore
from .metrics import FAMILIES
from .subsystem import XidSettings, XidSubsystem, read_boot_id

__all__ = [
    "FAMILIES",
    "Classifier",
    "HolderLookup",
    "Observation",
    "XidClassesError",
    "XidCore",
    "XidSettings",
    "XidSubsystem",
    "load_classifier",
    "read_boot_id",
]
