"""Everything the exposition holds, in family order: identity, each job's last samples (as the
block the job rendered), the other parts' sources, the sampler's self-metrics."""

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


def all_blocks(
    system: SystemInfo | None,
    gpus: Sequence[GpuState],
    identities: IdentityCache,
    sources: Iterable[SampleSource],
    self_samples: Iterable[Sample],
) -> Iterator[Block]:
    """The exposition's parts in order: identity, every job's block (kept from its last run, so
    a slow job's lines are not formatted again each fast round), sources and self-metrics."""
    yield render_block(_identity_samples(system, gpus, identities))
    for state in gpus:
        for job in state.jobs:
            yield job.block
    for source in sources:
        yield render_block(source.samples())
    yield render_block(self_samples)


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
