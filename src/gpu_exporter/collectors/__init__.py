"""All collectors, in the order their families appear in the exposition."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .activity import ActivityCollector
from .base import Cadence, Collector, CollectorContext, SampleWriter, Scope, option
from .clock_events import ClockEventsCollector
from .clocks import ClocksCollector
from .ecc import EccCollector
from .engines import EnginesCollector
from .fabric import FabricCollector
from .interconnect import InterconnectCollector, NvLinkStateCollector
from .memory import MemoryCollector
from .mig_profiles import MigProfilesCollector
from .pcie_link import PcieLinkCollector
from .power import PowerCollector
from .recovery import RecoveryCollector
from .remap import RemapCollector
from .retired_pages import RetiredPagesCollector
from .temperature import TemperatureCollector
from .thresholds import ThresholdsCollector
from .utilization import UtilizationCollector

ALL_COLLECTORS: tuple[type[Collector], ...] = (
    ActivityCollector,
    UtilizationCollector,
    MemoryCollector,
    PowerCollector,
    TemperatureCollector,
    ThresholdsCollector,
    ClocksCollector,
    ClockEventsCollector,
    EccCollector,
    RemapCollector,
    RetiredPagesCollector,
    RecoveryCollector,
    NvLinkStateCollector,
    PcieLinkCollector,
    InterconnectCollector,
    FabricCollector,
    EnginesCollector,
    MigProfilesCollector,
)


def collector_names() -> tuple[str, ...]:
    return tuple(c.name for c in ALL_COLLECTORS)


def option_classes(collectors: Iterable[type[Collector]]) -> tuple[type[Any], ...]:
    """The options classes the collectors read, each once (several may read one), in order."""
    return tuple(dict.fromkeys(kind for collector in collectors for kind in collector.options))


__all__ = [
    "ALL_COLLECTORS",
    "Cadence",
    "Collector",
    "CollectorContext",
    "SampleWriter",
    "Scope",
    "collector_names",
    "option",
    "option_classes",
]
