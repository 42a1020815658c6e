"""The GPU-instance profiles a MIG-capable GPU offers, whether or not MIG mode is on.

``gpu_mig_profile_memory_bytes{profile}`` and ``gpu_mig_profile_compute_fraction{profile}`` (the
profile's compute slices / the GPU's, 2/7 for a 2g profile) let right-sizing rules price a move
to a slice. NVML lists the profiles only while MIG mode is on; otherwise (and on a GPU that
answers for none) they come from ``data/mig_profiles.tsv`` by model. A GPU without MIG
(``gpu_info{mig_mode="unsupported"}``: L40S, V100) costs no call and has no series.

Profiles are fixed for a GPU and driver: the table is read once per GPU (the collector is rebuilt
when the GPU's layout changes, MIG mode included) and kept, so later slow rounds cost no call.
"""

from __future__ import annotations

from ..devices import Device
from ..exposition import gauge, label_string
from ..migprofiles import ProfileTable, catalog_table, nvml_table
from ..nvml import DeviceCalls
from .base import Cadence, Collector, CollectorContext, SampleWriter

MEMORY = gauge(
    "gpu_mig_profile_memory_bytes",
    "Memory of each MIG GPU-instance profile the GPU offers (whether or not MIG mode is on).",
)
COMPUTE_FRACTION = gauge(
    "gpu_mig_profile_compute_fraction",
    "Share of the GPU's compute slices a MIG GPU-instance profile has (2g on a 7-slice GPU: 2/7).",
)


class MigProfilesCollector(Collector):
    name = "mig_profiles"
    help = "MIG GPU-instance profiles each MIG-capable GPU offers: memory and compute share."
    cadence = Cadence.SLOW
    families = (MEMORY, COMPUTE_FRACTION)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._table: ProfileTable | None = None
        self._labels: tuple[tuple[str, float, float], ...] = ()

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        if self._table is None:
            self._table = self._read(calls)
            if self._table is None:
                return
            self.context.mig_profiles.record(self.device.uuid, self._table)
            self._labels = tuple(
                (
                    label_string({"profile": p.name}),
                    p.memory_mib * 2**20,
                    self._table.compute_fraction(p),
                )
                for p in self._table.profiles
            )
        for labels, memory, fraction in self._labels:
            out.add(MEMORY, memory, labels)
            out.add(COMPUTE_FRACTION, fraction, labels)

    def _read(self, calls: DeviceCalls) -> ProfileTable | None:
        if self.device.id.mig_mode == "unsupported":
            return None  # NVML says the GPU has no MIG mode: no call, no series
        table = nvml_table(self.device.handle, calls)
        if calls.failures:
            return None  # an unexpected error left the table incomplete: read it next round
        return table or catalog_table(self.device.id.model)
