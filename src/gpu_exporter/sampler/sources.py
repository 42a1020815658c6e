"""What other parts implement to take part in sampling: the sampler calls them on the event loop."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from ..devices import DeviceId
from ..exposition import Family, Sample


class DeviceListener(Protocol):
    """Told of hardware conditions the sampler sees: lost and recovered GPUs (on the event
    loop), and failed row remaps (from a worker thread, on every slow round while it stands)."""

    def device_lost(self, gpu: DeviceId) -> None: ...

    def device_recovered(self, gpu: DeviceId) -> None:
        """A GPU confirmed lost answers again: it was reset (or the node rebooted)."""

    def note_remap_failure(self, device: DeviceId) -> None: ...


class RoundListener(Protocol):
    """Told when a fast round has settled, before its exposition is rendered (on the event loop):
    the activity ledger holds that round's points, and what the listener's samples change now
    is in the same rendering. A part that accounts per sampling interval needs no timer of its
    own."""

    def round_done(self) -> None: ...


class SampleSource(Protocol):
    """Series that other parts (Xid, allocation) add to the exposition; read on the event loop."""

    families: Sequence[Family]

    def samples(self) -> Iterable[Sample]: ...
