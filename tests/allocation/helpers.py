"""Test helpers: a device inventory, a fake clock, a fake kubelet, exposition parsing."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from grpclib.const import Status

from gpu_exporter.allocation.podresources import ClaimDevice, ContainerDevices
from gpu_exporter.devices import Device, DeviceId
from gpu_exporter.exposition import Sample, render
from gpu_exporter.simulator.podresources_server import (
    UNIMPLEMENTED,
    KubeletState,
    PodResourcesServer,
)
from tests.helpers import ManualClock

UUID_A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"  # whole GPU with GPM
UUID_B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"  # MIG mode
UUID_C = "GPU-cccccccc-0000-4000-8000-000000000000"  # time-sliced, no GPM
UUID_D = "GPU-dddddddd-0000-4000-8000-000000000000"  # free
MIG_1 = "MIG-11111111-0000-4000-8000-000000000000"  # on B, gi 1
MIG_2 = "MIG-22222222-0000-4000-8000-000000000000"  # on B, gi 2

GPU_A = DeviceId(0, UUID_A, gpm_supported=True)
GPU_B = DeviceId(1, UUID_B, mig_mode="enabled", gpm_supported=True)
GPU_C = DeviceId(2, UUID_C)
GPU_D = DeviceId(3, UUID_D, gpm_supported=True)
MIG_B1 = DeviceId(
    1, MIG_1, mig_mode="enabled", gpm_supported=True, parent_uuid=UUID_B,
    gpu_instance_id=1, compute_instance_id=0, mig_profile="3g.40gb",
)  # fmt: skip
MIG_B2 = DeviceId(
    1, MIG_2, mig_mode="enabled", gpm_supported=True, parent_uuid=UUID_B,
    gpu_instance_id=2, compute_instance_id=0, mig_profile="1g.10gb",
)  # fmt: skip
INVENTORY = (GPU_A, GPU_B, MIG_B1, MIG_B2, GPU_C, GPU_D)


def devices() -> list[Device]:
    return [Device(device_id, handle=None) for device_id in INVENTORY]


FakeClock = ManualClock  # one manual clock for every test (tests/helpers.py)


@dataclass
class FakeKubelet:
    """A real pod-resources gRPC server (simulator/podresources_server.py, grpclib) whose
    answers the test edits."""

    socket_path: Path
    containers: list[ContainerDevices] = field(default_factory=list)
    allocatable: list[tuple[str, str]] | None = field(default_factory=list)
    claims: list[ClaimDevice] = field(default_factory=list)
    # How GetAllocatableResources is refused while ``allocatable`` is None.
    refusal: tuple[Status, str] = UNIMPLEMENTED
    server: PodResourcesServer | None = None
    # Containers of running pods listed without devices (namespace, pod, container).
    running: list[tuple[str, str, str]] = field(default_factory=list)

    def state(self) -> KubeletState:
        return KubeletState(
            list(self.containers), self.allocatable, self.claims, self.refusal, self.running
        )

    def hold(self, namespace: str, pod: str, container: str, resource: str, *ids: str) -> None:
        self.containers.append(ContainerDevices(namespace, pod, container, resource, ids))

    def claim(
        self,
        pod: tuple[str, str, str],  # namespace, pod, container
        claim: tuple[str, str],  # claim namespace, claim name
        device: str,
        *cdi: str,
        driver: str = "gpu.nvidia.com",
        pool: str = "node-1",
    ) -> None:
        self.claims.append(ClaimDevice(*pod, *claim, driver, pool, device, cdi))

    def release(self, pod: str) -> None:
        self.containers = [c for c in self.containers if c.pod != pod]
        self.claims = [c for c in self.claims if c.pod != pod]

    async def start(self) -> None:
        self.server = PodResourcesServer(self.socket_path, self.state)
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()


def series(samples: Iterable[Sample]) -> dict[str, float]:
    """``name{labels}`` -> value, parsed back from the rendered text exposition (with the
    families only the status page reads)."""
    exposition = render(list(samples))
    text = (exposition.text + exposition.unserved).decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def named(values: dict[str, float], name: str) -> dict[str, float]:
    return {k: v for k, v in values.items() if k == name or k.startswith(name + "{")}
