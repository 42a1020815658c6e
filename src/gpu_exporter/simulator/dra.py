"""The simulated node's DRA side, as NVIDIA's DRA driver and the kubelet present it.

Allocations with a ``claim`` are held through a ResourceClaim of driver ``gpu.nvidia.com``
instead of a device plugin (reference/dra.md):

- device names as the driver publishes them: ``gpu-<minor>`` (the device *minor*), and for a
  MIG instance ``gpu-<parent minor>-mig-<profile>-<GI profile id>-<placement start>`` (25.12+);
- pool name = the node name; CDI devices ``k8s.gpu.nvidia.com/claim=<claim uid>-<device>``;
- the kubelet lists, for every container naming a claim, the *whole* claim, and accumulates
  the CDI names of a claim's earlier devices into each later one (the quirk consumers must
  survive);
- one transient CDI spec per claim, ``<cdi dir>/k8s.gpu.nvidia.com-claim_<uid>.yaml``, with the
  device nodes the driver writes (``/dev/nvidia<minor>``; for MIG also the GPU and compute
  instance capability nodes), written while the claim is held and removed when it is not;
- ``<nvidia-caps dir>/mig-minors`` as the driver lays it out (every GPU minor 0-31, GPU
  instances 0-14, compute instances 0-7).

A ``compute_domain_claim`` adds an IMEX channel (``compute-domain.nvidia.com``, ``channel-0``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpu_exporter.allocation.podresources import ClaimDevice

if TYPE_CHECKING:
    from gpu_exporter.simulator.devices import GpuDevice
    from gpu_exporter.simulator.node import Allocation

GPU_DRIVER = "gpu.nvidia.com"
COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"
CDI_KIND = "k8s.gpu.nvidia.com/claim"
CDI_VERSION = "0.8.0"
# mig-minors, as the NVIDIA driver numbers it: config 1, monitor 2, then per GPU minor, per GPU
# instance, the instance's access minor followed by its compute instances'.
MAX_GPUS, MAX_GPU_INSTANCES, MAX_COMPUTE_INSTANCES = 32, 15, 8
_PER_GI = 1 + MAX_COMPUTE_INSTANCES
_PER_GPU = MAX_GPU_INSTANCES * _PER_GI
NVIDIA_CAPS_MAJOR = 511  # dynamic on a real host (/proc/devices); any value here


def gi_minor(gpu_minor: int, gpu_instance: int) -> int:
    return 3 + gpu_minor * _PER_GPU + gpu_instance * _PER_GI


def ci_minor(gpu_minor: int, gpu_instance: int, compute_instance: int) -> int:
    return gi_minor(gpu_minor, gpu_instance) + 1 + compute_instance


def mig_minors_text() -> str:
    lines = ["config 1", "monitor 2"]
    for gpu in range(MAX_GPUS):
        for gi in range(MAX_GPU_INSTANCES):
            lines.append(f"gpu{gpu}/gi{gi}/access {gi_minor(gpu, gi)}")
            lines += [
                f"gpu{gpu}/gi{gi}/ci{ci}/access {ci_minor(gpu, gi, ci)}"
                for ci in range(MAX_COMPUTE_INSTANCES)
            ]
    return "\n".join(lines) + "\n"


def claim_uid(namespace: str, name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"resourceclaim/{namespace}/{name}"))


class DraDevice:
    """One allocated device as the DRA driver names it, and the device nodes it gets."""

    def __init__(self, gpu: GpuDevice, mig: int | None) -> None:
        minor = gpu.spec.device_minor
        self.nodes: list[dict[str, Any]] = [{"path": f"/dev/nvidia{minor}"}]
        if mig is None:
            self.name = f"gpu-{minor}"
            return
        spec = gpu.migs[mig].spec
        profile = spec.profile.name.lower().replace(".", "").replace("+", "-")
        self.name = f"gpu-{minor}-mig-{profile}-{spec.profile.profile_id}-{spec.start_slice}"
        gi = spec.gpu_instance_id
        for cap in (gi_minor(minor, gi), ci_minor(minor, gi, 0)):
            self.nodes.append(
                {
                    "path": f"/dev/nvidia-caps/nvidia-cap{cap}",
                    "type": "c",
                    "major": NVIDIA_CAPS_MAJOR,
                    "minor": cap,
                }
            )


def claim_devices(
    allocations: Sequence[Allocation], gpus: Sequence[GpuDevice], pool: str
) -> list[ClaimDevice]:
    """What the kubelet lists in ``dynamic_resources`` for the node's claim allocations."""
    devices = _devices_by_claim(allocations, gpus)
    listed: list[ClaimDevice] = []
    done: set[tuple[str, str, str, str]] = set()
    for a in allocations:
        spec = a.spec
        if spec.claim is None:
            continue
        key = (spec.namespace, spec.pod, spec.container, spec.claim)
        if key in done:
            continue  # the container names the claim once, however many devices it has
        done.add(key)
        where = (spec.namespace, spec.pod, spec.container, spec.namespace, spec.claim)
        uid = claim_uid(spec.namespace, spec.claim)
        cdi: list[str] = []
        for device in devices[(spec.namespace, spec.claim)]:
            cdi.append(f"{CDI_KIND}={uid}-{device.name}")  # accumulates, as the kubelet's does
            listed.append(ClaimDevice(*where, GPU_DRIVER, pool, device.name, tuple(cdi)))
        if spec.compute_domain_claim is not None:
            channel = (spec.namespace, spec.compute_domain_claim, COMPUTE_DOMAIN_DRIVER, pool)
            listed.append(ClaimDevice(*where[:3], *channel, "channel-0"))
    return listed


def _devices_by_claim(
    allocations: Iterable[Allocation], gpus: Sequence[GpuDevice]
) -> dict[tuple[str, str], list[DraDevice]]:
    claims: dict[tuple[str, str], dict[str, DraDevice]] = {}
    for a in allocations:
        if a.spec.claim is not None:
            device = DraDevice(gpus[a.spec.gpu], a.spec.mig)
            claims.setdefault((a.spec.namespace, a.spec.claim), {}).setdefault(device.name, device)
    return {key: list(by_name.values()) for key, by_name in claims.items()}


class CdiFiles:
    """The driver's per-claim CDI specs and the host's mig-minors, under a scratch root."""

    def __init__(self, root: Path) -> None:
        self.spec_dir = root / "cdi"
        self.nvidia_caps_path = root / "nvidia-caps"
        self._written: dict[Path, str] = {}

    def sync(self, allocations: Sequence[Allocation], gpus: Sequence[GpuDevice]) -> None:
        """Write a spec for each claim held now and remove the others (file I/O: a thread).

        Nothing is written until a claim is held (a node without DRA has no files to show)."""
        claims = _devices_by_claim(allocations, gpus)
        if not claims and not self._written:
            return
        self.spec_dir.mkdir(parents=True, exist_ok=True)
        minors = self.nvidia_caps_path / "mig-minors"
        if not minors.exists():
            self.nvidia_caps_path.mkdir(parents=True, exist_ok=True)
            minors.write_text(mig_minors_text())
        wanted: dict[Path, str] = {}
        for (namespace, claim), devices in claims.items():
            uid = claim_uid(namespace, claim)
            path = self.spec_dir / f"k8s.gpu.nvidia.com-claim_{uid}.yaml"
            wanted[path] = text = spec_text(uid, devices)
            if self._written.get(path) != text:
                _write_atomically(path, text)
        for stale in self._written.keys() - wanted.keys():
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()  # Unprepare removes the claim's spec
        self._written = wanted


def spec_text(uid: str, devices: Iterable[DraDevice]) -> str:
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
        },
        "devices": [
            {"name": f"{uid}-{d.name}", "containerEdits": {"deviceNodes": d.nodes}} for d in devices
        ],
    }
    return yaml.safe_dump(spec, sort_keys=False)


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.replace(path)
