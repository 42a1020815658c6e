"""Everything the exposition holds, in family order, as blocks: identity, each job's last
samples (the block the job wrote), the other parts' sources, the sampler's self-metrics.
Gathering the parts (:func:`exposition_parts`, on the event loop) only records values; their
lines are formatted by the render that reads them, so that a round's render can gather on the
event loop and format on a thread. A source whose samples are those of a published snapshot is
not even gathered there: its part is the snapshot's samples, still to be written into a block by
the render (:func:`blocks_of`), on the thread."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from .. import identity
from ..collectors import Collector
from ..devices import Device, DeviceId, Gpu, SystemInfo
from ..exposition import EMPTY_BLOCK, Block, Family, Sample, render_block
from .liveness import GpuState
from .selfmetrics import SELF_FAMILIES
from .sources import SampleSource


def family_order(
    collector_types: Iterable[type[Collector]], sources: Iterable[tuple[SampleSource, bool]]
) -> list[Family]:
    families: list[Family] = list(identity.FAMILIES)
    for collector_type in collector_types:
        families.extend(collector_type.families)
    for source, _ in sources:
        families.extend(source.families)
    families.extend(SELF_FAMILIES)
    return families


# What the identity part is written from: the system, and each GPU as found and whether up.
_WrittenFrom = tuple[SystemInfo | None, tuple[tuple[Gpu | None, bool], ...]]


class IdentityCache:
    """The identity part (build info, ``gpu_info``/``gpu_mig_info``, ``gpu_up``), written again
    only when a GPU is replaced, lost or back, or :meth:`clear` says an identity changed; each
    device's sample is built once per identity."""

    def __init__(self) -> None:
        self._samples: dict[DeviceId, Sample] = {}
        self._block = EMPTY_BLOCK
        self._written_from: _WrittenFrom | None = None

    def clear(self) -> None:
        """Rebuilt on the next render; drops vanished MIG instances."""
        self._samples.clear()
        self._written_from = None

    def block(self, system: SystemInfo | None, gpus: Sequence[GpuState]) -> Block:
        written_from = (system, tuple((state.gpu, state.up) for state in gpus))
        if written_from != self._written_from:
            self._block = render_block(self._identity_samples(system, gpus))
            self._written_from = written_from
        return self._block

    def _identity_samples(
        self, system: SystemInfo | None, gpus: Sequence[GpuState]
    ) -> Iterator[Sample]:
        yield identity.build_info(system)
        for state in gpus:
            if state.gpu is not None:
                devices = state.gpu.devices() if state.up else iter((state.gpu.device,))
                for device in devices:
                    yield self._sample(device, system)
            yield identity.up_sample(state.up_labels, state.up)

    def _sample(self, device: Device, system: SystemInfo | None) -> Sample:
        sample = self._samples.get(device.id)
        if sample is None:
            driver = system.driver_version if system else ""
            sample = next(identity.identity_samples((device,), driver))
            self._samples[device.id] = sample
        return sample


# A part of the exposition: a block, or a published snapshot's samples that the render writes
# into one (exposition_parts).
Part = Block | Iterable[Sample]


def exposition_parts(
    system: SystemInfo | None,
    gpus: Sequence[GpuState],
    identities: IdentityCache,
    sources: Iterable[tuple[SampleSource, bool]],
    self_samples: Iterable[Sample],
) -> list[Part]:
    """The exposition's parts in order, as of now: identity, every job's block, sources and
    self-metrics. Called on the event loop, where the parts' state is written. The sources' and
    self-metrics' samples are written into blocks as they are generated, each sample dropped
    once written rather than held until a render on another thread reads it: what the loop
    builds and a render holds is one object per part (exposition.Block). A source marked
    frozen (``(source, True)``: its samples read a published snapshot only) is the exception:
    its part is the iterable its ``samples()`` returns, unread, for the render to write
    (:func:`blocks_of`) wherever it runs. On ``mig56`` that is the allocation's rows, most of
    what gathering cost the loop."""
    parts: list[Part] = [identities.block(system, gpus)]
    for state in gpus:
        parts.extend(job.block for job in state.jobs)
    for source, frozen in sources:
        parts.append(source.samples() if frozen else render_block(source.samples()))
    parts.append(render_block(self_samples))
    return parts


def blocks_of(parts: Iterable[Part]) -> Iterator[Block]:
    """Each part as a block: a snapshot's samples are written into one now."""
    for part in parts:
        yield part if isinstance(part, Block) else render_block(part)
