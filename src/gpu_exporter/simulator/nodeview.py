"""What the fake libraries see of the simulated node: the state they read and change, typed as a
protocol so that ``library.py``, the ``nvml_*`` modules and the fake libdcgm depend on this
interface, not on ``node.py`` (which builds them: importing it back would tie the simulator into
one import cycle). :class:`~gpu_exporter.simulator.node.SimulatedNode` implements it."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Protocol

from gpu_exporter.simulator.devices import Device, GpuDevice, MigDevice
from gpu_exporter.simulator.drivers import FieldLayout
from gpu_exporter.simulator.injected import Failure, Hang
from gpu_exporter.simulator.nvml_records import EventSet, GpmSample
from gpu_exporter.simulator.scenario import Scenario
from gpu_exporter.simulator.topology import NodeTopology


class NodeView(Protocol):
    scenario: Scenario
    topology: NodeTopology
    lock: threading.RLock
    gpus: list[GpuDevice]
    gpu_instances: dict[int, MigDevice]  # address of a GPU-instance handle -> its MIG device
    event_sets: dict[int, EventSet]
    gpm_samples: dict[int, GpmSample]  # address of a GPM sample buffer -> what it recorded
    # Address -> every struct a handle given out points at (devices, GPU instances, event sets,
    # GPM samples), kept alive as the library's own memory is, until the library frees it.
    pointed_at: dict[int, Any]
    hangs: list[Hang]
    failures: dict[tuple[str, int | None], Failure]
    calls: Counter[str]  # NVML C function -> times called
    field_requests: Counter[int]  # field id -> times asked
    field_layout: FieldLayout
    init_count: int
    closed: threading.Event
    wall_origin: float

    def now(self) -> float: ...

    def advance(self, *, integrate: bool = True, gpu: GpuDevice | None = None) -> float: ...

    def seconds_until_due(self) -> float: ...

    def integrated_at(self, gpu: GpuDevice) -> float: ...

    @property
    def visible_gpus(self) -> list[GpuDevice]: ...

    def device_of(self, handle: Any) -> Device | None: ...

    def hang_for(self, function: str, gpu: int | None) -> Hang | None: ...

    def failure_for(self, function: str, gpu: int | None) -> int | None: ...

    def mps_servers(self, device: Device) -> list[tuple[int, int, MigDevice | None]]: ...
