"""Everything the exposition holds, in family order: identity, each job's last samples (as the
block the job rendered), the other parts' sources, the sampler's self-metrics. Gathering the parts
(:func:`exposition_parts`) is separate from writing them (:func:`blocks_of`), so that a round's
render can gather on the event loop and write on a thread."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from .. import identity
from ..collectors import Collector
from ..devices import Device, DeviceId, SystemInfo
from ..exposition import Block, Family, Sample, render_block
from .liveness import GpuState
from .selfmetrics import SELF_FAMILIES
from .sources import SampleSource


def family_order(
    collector_types: Iterable[type[Collector]], sources: Iterable[SampleSource]
) -> list[Family]:
    families: list[Family] = list(identity.FAMILIES)
    for collector_type in collector_types:
        families.extend(collector_type.families)
    for source in sources:
        families.extend(source.families)
    families.extend(SELF_FAMILIES)
    return families


class IdentityCache:
    """``gpu_info``/``gpu_mig_info``, built once per device identity, not on every render."""

    def __init__(self) -> None:
        self._samples: dict[DeviceId, Sample] = {}

    def clear(self) -> None:
        """Rebuilt on the next render; drops vanished MIG instances."""
        self._samples.clear()

    def sample(self, device: Device, system: SystemInfo | None) -> Sample:
        sample = self._samples.get(device.id)
        if sample is None:
            driver = system.driver_version if system else ""
            sample = next(identity.identity_samples((device,), driver))
            self._samples[device.id] = sample
        return sample


# One part of the exposition: a job's block (kept from its last run, so a slow job's lines are
# not formatted again each fast round), or samples that a render writes as a block.
Part = Block | list[Sample]


def exposition_parts(
    system: SystemInfo | None,
    gpus: Sequence[GpuState],
    identities: IdentityCache,
    sources: Iterable[SampleSource],
    self_samples: Iterable[Sample],
) -> list[Part]:
    """The exposition's parts in order, as of now: identity, every job's block, sources and
    self-metrics. Called on the event loop, where the parts' state is written; it only reads
    (the samples are immutable), so writing the parts as blocks can happen on any thread."""
    parts: list[Part] = [list(_identity_samples(system, gpus, identities))]
    for state in gpus:
        parts.extend(job.block for job in state.jobs)
    parts.extend(list(source.samples()) for source in sources)
    parts.append(list(self_samples))
    return parts


def blocks_of(parts: Iterable[Part]) -> Iterator[Block]:
    """Every part as a block, for :func:`~gpu_exporter.exposition.render_blocks`."""
    for part in parts:
        yield part if isinstance(part, Block) else render_block(part)


def _identity_samples(
    system: SystemInfo | None, gpus: Sequence[GpuState], identities: IdentityCache
) -> Iterator[Sample]:
    yield identity.build_info(system)
    for state in gpus:
        if state.gpu is not None:
            devices = state.gpu.devices() if state.up else iter((state.gpu.device,))
            for device in devices:
                yield identities.sample(device, system)
        yield identity.up_sample(state.up_labels, state.up)
