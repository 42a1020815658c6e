"""The collector interface: one module per collector, one instance per device.

A collector class declares its ``name`` (the ``--collector.<name>`` switch), its ``cadence``
(fast signals every second, slow ones every 30 s by default), the metric families it may emit, and
which devices it applies to. The sampler creates one instance per applicable device, so the
instance holds that device's state between samples (integrals, GPM sample buffers), and calls
:meth:`Collector.collect` on a worker thread. A failure stays inside that (collector, device)
pair; :class:`~gpu_exporter.nvml.DeviceLost` is the one exception meant to travel up.

A collector's options (``--collector.<name>.<option>``) are declared in its own module, as
node_exporter declares a collector's flags in its file: a frozen dataclass of :func:`option`
fields, named in the collector's ``options``. The CLI finds them through ``ALL_COLLECTORS`` and
hands their parsed values in through :attr:`CollectorContext.options`, so a new option touches
the collector's module and the README's flags table, nothing else.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from ..dcgm.readings import DcgmLink
from ..devices import Device, DeviceId
from ..exposition import BlockWriter, Family
from ..ledger import ActivityLedger
from ..migprofiles import MigProfileBook
from ..nvml import DeviceCalls
from ..settings import CollectorOptions, ValueType, setting
from .fields import FieldBatch, FieldBatches


class Cadence(Enum):
    FAST = "fast"
    SLOW = "slow"


class Scope(Enum):
    GPU = "gpu"  # whole GPUs only
    MIG = "mig"  # MIG instances only
    ANY = "any"  # both


@dataclass(frozen=True)
class CollectorContext:
    """What a collector may depend on besides NVML: the cadences' intervals, its options, a clock
    and the state it shares with other parts."""

    fast_interval: float
    slow_interval: float
    # Every collector's option values: a collector reads its own, ``options.of(ItsOptions)``.
    options: CollectorOptions = field(default_factory=CollectorOptions)
    clock: Callable[[], float] = time.monotonic
    ledger: ActivityLedger = field(default_factory=ActivityLedger)
    # Each GPU's MIG profile table, for right-sizing (the mig_profiles collector writes it).
    mig_profiles: MigProfileBook = field(default_factory=MigProfileBook)
    # Which devices DCGM serves, and its readings for their activity collectors.
    dcgm: DcgmLink = field(default_factory=DcgmLink)
    # Told (from a worker thread) each time a device reports a failed row remap: the drain latch.
    on_remap_failure: Callable[[DeviceId], None] = lambda device: None
    # Field values, read once per device and round for all collectors (see fields.py).
    fields: FieldBatches | None = None

    def __post_init__(self) -> None:
        if self.fields is None:
            object.__setattr__(self, "fields", FieldBatches(self.clock))

    def field_batch(self, device: Device, cadence: Cadence) -> FieldBatch:
        assert self.fields is not None
        fast = cadence is Cadence.FAST
        interval = self.fast_interval if fast else self.slow_interval
        return self.fields.batch(device.uuid, cadence.value, interval)


class SampleWriter(BlockWriter):
    """Records one device's samples; each line will be led by the device's labels.

    The lines are formatted once, by the first render that reads the job's block, and the block
    is reused by every render until the job runs again (docs/performance.md, "Rendering")."""

    __slots__ = ()

    def __init__(self, device_labels: str) -> None:
        super().__init__(prefix=device_labels)


class Collector(ABC):
    name: ClassVar[str]
    cadence: ClassVar[Cadence]
    scope: ClassVar[Scope] = Scope.GPU
    families: ClassVar[tuple[Family, ...]]
    enabled_by_default: ClassVar[bool] = True
    help: ClassVar[str] = ""
    # The options classes (declared with option() fields) whose values this collector reads:
    # their flags exist because a collector in ALL_COLLECTORS names them here.
    options: ClassVar[tuple[type[Any], ...]] = ()

    def __init__(self, device: Device, context: CollectorContext) -> None:
        self.device = device
        self.context = context

    @classmethod
    def applies_to(cls, device: Device) -> bool:
        if cls.scope is Scope.ANY:
            return True
        return device.id.is_mig == (cls.scope is Scope.MIG)

    @abstractmethod
    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        """Read this device's signals and write samples. Runs on a worker thread."""

    def close(self, calls: DeviceCalls) -> None:  # noqa: B027 - optional hook
        """Release NVML resources held for the device (runs on a worker thread)."""


def option(flag: str, default: Any, type: ValueType | None = None, *, help: str) -> Any:
    """A field of a collector's options class that is also its flag (no type: an on/off switch),
    in ``--help``'s collectors group; the README's flags table shows it with its default."""
    if not flag.startswith("--collector."):
        raise ValueError(f"{flag}: a collector's option is spelt --collector.<name>.<option>")
    return setting(flag, default, type, group="collectors", help=help)


class Integral:
    """The time integral of a ratio: ``rate(x_seconds_total[w])`` is then the exact mean over w.

    ``add(ratio, now)`` credits ``ratio`` for the time since the previous call, so the value must
    describe that interval (GPM's metrics do exactly; NVML utilisation approximately).
    """

    def __init__(self) -> None:
        self.total = 0.0
        self._last: float | None = None

    def add(self, ratio: float, now: float) -> float:
        if self._last is not None and now > self._last:
            self.total += ratio * (now - self._last)
        self._last = now
        return self.total


def clamp_ratio(percent: float) -> float:
    """NVML reports percent; Prometheus wants 0..1."""
    return min(max(percent / 100.0, 0.0), 1.0)
