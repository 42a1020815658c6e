"""Runtime state of simulated GPUs and MIG instances, and how their counters advance with time."""

from __future__ import annotations

import dataclasses
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import pynvml

from gpu_exporter.simulator.links import Interconnect
from gpu_exporter.simulator.models import MIG_SLICES, GpuModel
from gpu_exporter.simulator.patterns import Placed, integrate, total_at
from gpu_exporter.simulator.scenario import GpuSpec, MigInstanceSpec, WorkloadSpec

Metric = Literal["sm", "occupancy", "tensor", "dram", "util"]
METRICS: tuple[Metric, ...] = ("sm", "occupancy", "tensor", "dram", "util")
# Without an explicit occupancy, warps occupy about half of the theoretical maximum while busy.
DEFAULT_OCCUPANCY = 0.5
# What the driver itself keeps on an otherwise empty GPU ("used" with memory_v2).
DRIVER_USED_BYTES = 4 * 2**20
# Device memory an MPS control server keeps per device it serves (nvidia-smi shows ~25-40 MiB).
MPS_SERVER_BYTES = 32 * 2**20
# Clock (and so dynamic power) factor while a clock-limiting reason is active.
CLOCK_FACTORS = {
    "applications_clocks_setting": 0.9,
    "sw_power_cap": 0.75,
    "hw_slowdown": 0.5,
    "sync_boost": 0.9,
    "sw_thermal_slowdown": 0.8,
    "hw_thermal_slowdown": 0.6,
    "hw_power_brake_slowdown": 0.5,
    "display_clock_setting": 1.0,
}
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
# nvml.h documents HwSlowdown (0x8) as an indicator of, among others, a too-high temperature and
# an external power brake: it is set with HwThermalSlowdown (0x40) and HwPowerBrakeSlowdown (0x80),
# as nvidia-smi -q shows "HW Slowdown: Active" beside either. Alone it stands for the other causes
# (power draw too high, fast-trigger protection), which the throttle event hw_slowdown models.
HW_SLOWDOWN_CAUSES = frozenset({"hw_thermal_slowdown", "hw_power_brake_slowdown"})
# Typical bus numbers of an 8-GPU HGX board, so bus ids look like the real thing.
HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


@dataclass
class Accumulators:
    """Time integrals since t=0: activity ratios in ratio-seconds, ``idle`` in seconds."""

    sm: float = 0.0
    occupancy: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0
    util: float = 0.0
    idle: float = 0.0

    def snapshot(self) -> Accumulators:
        return Accumulators(self.sm, self.occupancy, self.tensor, self.dram, self.util, self.idle)

    def add(self, other: Accumulators, weight: float = 1.0) -> None:
        for name in METRICS:
            setattr(self, name, getattr(self, name) + weight * getattr(other, name))


@dataclass
class Workload:
    """A running workload: the scenario's spec, its pid, and when it started."""

    spec: WorkloadSpec
    pid: int
    origin: float
    _signals: dict[Metric, Placed] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Spec and origin never change, and every integration asks for each metric's signal.
        self._signals = {metric: self._placed(metric) for metric in METRICS}

    def signal(self, metric: Metric) -> Placed:
        return self._signals[metric]

    def _placed(self, metric: Metric) -> Placed:
        spec = self.spec
        if metric == "occupancy":
            if spec.occupancy is not None:
                return Placed(spec.occupancy, self.origin)
            return Placed(spec.sm, self.origin, DEFAULT_OCCUPANCY)
        if metric == "util":
            return Placed(spec.utilization or spec.sm.busy(), self.origin)
        pattern = {"sm": spec.sm, "tensor": spec.tensor, "dram": spec.dram}[metric]
        return Placed(pattern, self.origin)


class Activity:
    """Workloads on one schedulable device (a whole GPU or a MIG instance)."""

    def __init__(self) -> None:
        self._workloads: tuple[Workload, ...] = ()
        # Each metric's signals, one per workload: every read and integration asks for them.
        self._signals: dict[Metric, tuple[Placed, ...]] = {}
        self.acc = Accumulators()

    @property
    def workloads(self) -> tuple[Workload, ...]:
        return self._workloads

    @workloads.setter
    def workloads(self, workloads: Iterable[Workload]) -> None:
        self._workloads = tuple(workloads)
        self._signals = {}

    def signals(self, metric: Metric) -> tuple[Placed, ...]:
        signals = self._signals.get(metric)
        if signals is None:
            signals = self._signals[metric] = tuple(w.signal(metric) for w in self._workloads)
        return signals

    def integrate(self, a: float, b: float) -> Accumulators:
        """Integrals over [a, b] (and add them to the running totals)."""
        delta = Accumulators()
        for metric in METRICS:
            result = integrate(self.signals(metric), a, b)
            setattr(delta, metric, result.integral)
            if metric == "util":
                delta.idle = result.zero_time
        self.acc.add(delta)
        self.acc.idle += delta.idle
        return delta

    def now(self, metric: Metric, t: float) -> float:
        return total_at(self.signals(metric), t)

    def mean(self, metric: Metric, a: float, b: float) -> float:
        return integrate(self.signals(metric), a, b).integral / (b - a)

    def memory_used(self) -> int:
        return sum(w.spec.memory for w in self.workloads) + self.mps_server_bytes()

    def mps_server_bytes(self) -> int:
        return MPS_SERVER_BYTES if any(w.spec.mps for w in self.workloads) else 0


class MigDevice(Activity):
    """A MIG instance (one compute instance per GPU instance, as the device plugin creates)."""

    kind = "mig"

    def __init__(self, parent: GpuDevice, spec: MigInstanceSpec, generation: int = 0) -> None:
        super().__init__()
        self.parent = parent
        self.spec = spec
        # A reconfiguration (generation > 0) makes new instances: new UUIDs, same GI ids.
        layout = f"/gen{generation}" if generation else ""
        self.uuid = "MIG-" + str(
            uuid.uuid5(uuid.NAMESPACE_URL, f"{parent.uuid}{layout}/gi{spec.gpu_instance_id}")
        )
        self.handle = pynvml.struct_c_nvmlDevice_t()
        self.gi_handle = pynvml.struct_c_nvmlGpuInstance_t()

    @property
    def gpu(self) -> GpuDevice:
        return self.parent

    @property
    def weight(self) -> float:
        return self.spec.profile.slices / MIG_SLICES

    @property
    def memory_total(self) -> int:
        return self.spec.profile.memory_mib * 2**20


@dataclass
class MemoryErrors:
    """ECC counters, row remapper and retired pages of one GPU."""

    ecc_volatile: dict[str, int] = field(default_factory=lambda: {"corrected": 0, "uncorrected": 0})
    ecc_aggregate: dict[str, int] = field(
        default_factory=lambda: {"corrected": 0, "uncorrected": 0}
    )
    remapped: dict[str, int] = field(default_factory=lambda: {"correctable": 0, "uncorrectable": 0})
    remap_pending: bool = False
    remap_failure: bool = False
    retired: list[tuple[str, int, bool]] = field(default_factory=list)

    def reset(self) -> None:
        """A GPU reset clears volatile counters and applies pending repairs."""
        self.ecc_volatile = {"corrected": 0, "uncorrected": 0}
        self.remap_pending = False
        self.retired = [(cause, address, False) for cause, address, _ in self.retired]


# Spare rows per DRAM bank and number of banks, for the row remapper histogram.
SPARE_ROWS_PER_BANK = 8
BANKS = 2560


def remap_histogram(remapped_rows: int) -> tuple[int, int, int, int, int]:
    """Banks by remaining spare rows (max, high, partial, low, none); rows fill banks in turn."""
    full, rest = divmod(remapped_rows, BANKS)
    counts = [0, 0, 0, 0, 0]
    counts[_bucket(SPARE_ROWS_PER_BANK - min(full + 1, SPARE_ROWS_PER_BANK))] += rest
    counts[_bucket(SPARE_ROWS_PER_BANK - min(full, SPARE_ROWS_PER_BANK))] += BANKS - rest
    return counts[0], counts[1], counts[2], counts[3], counts[4]


def _bucket(remaining: int) -> int:
    if remaining == SPARE_ROWS_PER_BANK:
        return 0
    if remaining > SPARE_ROWS_PER_BANK // 2:
        return 1
    if remaining > 1:
        return 2
    return 3 if remaining == 1 else 4


class GpuDevice(Activity):
    """A physical GPU."""

    kind = "gpu"

    def __init__(
        self, spec: GpuSpec, node_name: str, uptime: float, fabric: tuple[bytes, int] = (b"", 0)
    ) -> None:
        super().__init__()
        self.spec = spec
        self.index = spec.index
        self.model: GpuModel = spec.model
        self.uuid = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{node_name}/gpu{spec.index}"))
        self.serial = f"{1650000000000 + zlib.crc32(self.uuid.encode()) % 10**9}"
        self.bus = HGX_BUSES[spec.index] if spec.index < len(HGX_BUSES) else 0x1B + spec.index * 2
        self.handle = pynvml.struct_c_nvmlDevice_t()
        self.migs = [MigDevice(self, m) for m in spec.mig or ()]
        self.generation = 0  # MIG reconfigurations so far
        self.lost = False
        self.throttles: set[str] = set()
        self.reason_seconds: dict[str, float] = {}
        # The energy counter counts from driver load, which was ``uptime`` before t=0.
        self.energy_j = self.model.idle_power_w * uptime
        self.errors = MemoryErrors()
        self.recovery_action = 0
        # field id (as the driver numbers it) -> (value, nvmlValueType_t) answered instead
        self.field_overrides: dict[int, tuple[int, int]] = {}
        self.links = Interconnect.for_model(self.model, *fabric)
        self.persistence_mode = True
        self.compute_mode = spec.compute_mode  # NVML_COMPUTEMODE_*
        self.missing = False  # on the PCI bus, but never enumerated by NVML (dead at boot)

    @property
    def gpu(self) -> GpuDevice:
        return self

    @property
    def mig_enabled(self) -> bool:
        return self.spec.mig is not None

    @property
    def bus_id(self) -> str:
        return f"00000000:{self.bus:02X}:00.0"

    # ------------------------------------------------------------------ time integration

    def advance(self, a: float, b: float) -> None:
        """Integrate every counter over [a, b] under the current (constant) state."""
        if b <= a:
            return
        delta = self._activity_delta(a, b)
        dynamic = self.model.power_limit_w - self.model.idle_power_w
        load = 0.7 * delta.sm + 0.3 * delta.dram
        self.energy_j += self.model.idle_power_w * (b - a) + dynamic * self.clock_factor() * load
        for reason in self.throttles:
            self.reason_seconds[reason] = self.reason_seconds.get(reason, 0.0) + (b - a)
        self.reason_seconds["gpu_idle"] = self.reason_seconds.get("gpu_idle", 0.0) + delta.idle
        self.links.advance(b - a, delta.tensor, delta.dram)

    def _activity_delta(self, a: float, b: float) -> Accumulators:
        if not self.mig_enabled:
            return self.integrate(a, b)
        delta = Accumulators()
        for mig in self.migs:
            delta.add(mig.integrate(a, b), mig.weight)
        everything = [signal for m in self.migs for signal in m.signals("util")]
        delta.idle = integrate(everything, a, b).zero_time
        self.acc.add(delta)
        self.acc.idle += delta.idle
        return delta

    # ------------------------------------------------------------------ instantaneous readings

    def activity_now(self, metric: Metric, t: float) -> float:
        if not self.mig_enabled:
            return self.now(metric, t)
        total = 0.0
        for mig in self.migs:
            total += mig.weight * mig.now(metric, t)
        return total

    def clock_factor(self) -> float:
        return min((CLOCK_FACTORS[r] for r in self.throttles), default=1.0)

    def power_w(self, t: float) -> float:
        load = 0.7 * self.activity_now("sm", t) + 0.3 * self.activity_now("dram", t)
        dynamic = self.model.power_limit_w - self.model.idle_power_w
        return self.model.idle_power_w + dynamic * self.clock_factor() * load

    def temperature_c(self, t: float) -> int:
        heat = 12 if self.throttles & THERMAL_REASONS else 0
        return round(30 + 45 * self.power_w(t) / self.model.power_limit_w + heat)

    def idle_now(self, t: float) -> bool:
        return self.activity_now("util", t) <= 0

    def sm_clock_mhz(self, t: float) -> int:
        if self.idle_now(t):
            return self.model.idle_sm_clock_mhz
        return round(self.model.max_sm_clock_mhz * self.clock_factor())

    def reasons_mask(self, t: float) -> int:
        from gpu_exporter.simulator.scenario import THROTTLE_REASONS

        mask = 0
        for reason in self.throttles:
            mask |= THROTTLE_REASONS[reason]
        if self.throttles & HW_SLOWDOWN_CAUSES:
            mask |= THROTTLE_REASONS["hw_slowdown"]
        return mask | (THROTTLE_REASONS["gpu_idle"] if self.idle_now(t) else 0)

    # ------------------------------------------------------------------ memory and workloads

    def all_workloads(self) -> list[tuple[Workload, MigDevice | None]]:
        if self.mig_enabled:
            return [(w, m) for m in self.migs for w in m.workloads]
        return [(w, None) for w in self.workloads]

    def memory_used(self) -> int:
        servers = [self, *self.migs] if self.mig_enabled else [self]
        mps = sum(device.mps_server_bytes() for device in servers)
        return DRIVER_USED_BYTES + mps + sum(w.spec.memory for w, _ in self.all_workloads())

    @property
    def memory_total(self) -> int:
        return self.model.memory_mib * 2**20

    @property
    def memory_reserved(self) -> int:
        return self.model.reserved_mib * 2**20

    def reconfigure(self, layout: tuple[MigInstanceSpec, ...]) -> None:
        """Destroy every MIG instance and create ``layout``: slot ``i``'s device and GPU
        instance handles are reused, now naming a different instance (as real drivers do)."""
        old = self.migs
        self.generation += 1
        self.spec = dataclasses.replace(self.spec, mig=layout)
        self.migs = [MigDevice(self, m, self.generation) for m in layout]
        for previous, new in zip(old, self.migs, strict=False):
            new.handle, new.gi_handle = previous.handle, previous.gi_handle

    def reset(self) -> None:
        """What a GPU reset does: the device answers again, volatile state is cleared."""
        self.lost = False
        self.errors.reset()
        self.recovery_action = 0
        self.links.reset()


Device = GpuDevice | MigDevice
