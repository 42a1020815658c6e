"""What the allocation subsystem publishes: one immutable :class:`AllocationSnapshot` per change.

The subsystem builds a new snapshot on the event loop after each accounting round, poll that
changed something, process scan, activity read and placement, and replaces
``AllocationSubsystem.published`` with it. Readers on any thread read that attribute and keep
the value they got: the sampler's render (``samples``), the Xid reader threads (``holders``),
the status page (``processes``). Nobody waits on the event loop to read a dict.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ..exposition import Sample
from .history import HolderSnapshot
from .model import Allocations
from .placement import PlacementSnapshot
from .samples import AccountingSeries
from .unseen import ClassifiedProcess


@dataclass(frozen=True)
class AllocationSnapshot:
    up: bool = False  # whether the holder source (kubelet or Slurm) answered its last poll
    # The last resolved allocations: device-plugin and DRA holdings alike (a DRA holding names
    # its claim), and the schedulable devices. Kept while the source is down (not published).
    allocations: Allocations = field(default_factory=Allocations)
    holders: HolderSnapshot = field(default_factory=HolderSnapshot)  # for attributing events
    processes: tuple[ClassifiedProcess, ...] = ()  # every GPU process of the last scan, classed
    placement: PlacementSnapshot = field(default_factory=PlacementSnapshot)
    # Every series, in three parts: the source's state and who holds what; the time counters
    # and right-sizing (built when first read); sharing, placement, per-container memory and
    # activity.
    leading: tuple[Sample, ...] = ()
    accounting: AccountingSeries = field(default_factory=AccountingSeries)
    trailing: tuple[Sample, ...] = ()

    def samples(self) -> Iterator[Sample]:
        """Every series as of this snapshot, on any thread (it reads frozen values only). The
        time counters' samples are built as they are read, not kept: they are new every round."""
        yield from self.leading
        yield from self.accounting.samples()
        yield from self.trailing
