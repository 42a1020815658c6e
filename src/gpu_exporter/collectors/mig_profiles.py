"""The GPU-instance profiles a MIG-capable GPU offers, whether or not MIG mode is on, for
right-sizing (``allocation/rightsizing.py``), which publishes each model's compute fractions once
per node (``gpu_mig_profile_compute_fraction{model,profile}``): a fact of the model, not a series
per GPU (docs/migration.md). NVML lists the profiles only while MIG mode is on; otherwise (and on
a GPU that answers for none) they come from ``data/mig_profiles.tsv`` by model. A GPU without MIG
(``gpu_info{mig_mode="unsupported"}``: L40S, V100) costs no call.

Profiles are fixed for a GPU and driver: the table is read once per GPU (the collector is rebuilt
when the GPU's layout changes, MIG mode included) and kept, so later slow rounds cost no call.
"""

from __future__ import annotations

from ..devices import Device
from ..migprofiles import ProfileTable, catalog_table, nvml_table
from ..nvml import DeviceCalls
from .base import Cadence, Collector, CollectorContext, SampleWriter


class MigProfilesCollector(Collector):
    name = "mig_profiles"
    help = "MIG GPU-instance profiles each MIG-capable GPU offers, for right-sizing."
    cadence = Cadence.SLOW
    families = ()

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._table: ProfileTable | None = None

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        if self._table is None:
            self._table = self._read(calls)
            if self._table is not None:
                self.context.mig_profiles.record(
                    self.device.uuid, self._table, self.device.id.model
                )

    def _read(self, calls: DeviceCalls) -> ProfileTable | None:
        if self.device.id.mig_mode == "unsupported":
            return None  # NVML says the GPU has no MIG mode: no call, no series
        table = nvml_table(self.device.handle, calls)
        if calls.failures:
            return None  # an unexpected error left the table incomplete: read it next round
        return table or catalog_table(self.device.id.model)
