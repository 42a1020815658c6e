"""What the node's CDI spec files and the MIG capability minors say about DRA devices.

NVIDIA's DRA driver writes one CDI spec per prepared claim (``k8s.gpu.nvidia.com-claim_<uid>``,
under ``/var/run/cdi``; older releases a node-wide ``...-device_base`` spec, reference/dra.md).
A device's own ``deviceNodes`` name the hardware it gets: ``/dev/nvidia<minor>`` is the GPU (the
device minor NVML reports), and a MIG instance adds ``/dev/nvidia-caps/nvidia-cap<N>`` for its
GPU instance and compute instance, whose minors ``/proc/driver/nvidia-caps/mig-minors`` maps to
``gpu<minor>/gi<G>/ci<C>``. The UUID is never written into a spec: the minors are the link.

Reading is plain file I/O: call :func:`read_cdi_index` on a worker thread. Files that cannot be
read or parsed are skipped (specs come and go as claims are prepared and released).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_GPU_NODE = re.compile(r"^/dev/nvidia([0-9]{1,6})$")
_CAP_NODE = re.compile(r"^/dev/nvidia-caps/nvidia-cap([0-9]{1,6})$")
_MIG_MINOR = re.compile(
    r"^gpu([0-9]{1,6})/gi([0-9]{1,6})(?:/ci([0-9]{1,6}))?/access\s+([0-9]{1,9})$"
)
_SPEC_SUFFIXES = (".yaml", ".yml", ".json")
_MAX_SPEC_BYTES = 4 << 20  # a spec is a few KiB; refuse to parse anything absurd


@dataclass(frozen=True)
class DeviceNodes:
    """The NVIDIA device nodes one CDI device gives a container."""

    gpu_minors: tuple[int, ...] = ()  # /dev/nvidia<N>
    cap_minors: tuple[int, ...] = ()  # /dev/nvidia-caps/nvidia-cap<N>


@dataclass(frozen=True)
class MigMinor:
    """What a capability minor grants: a GPU instance, or one of its compute instances."""

    gpu_minor: int
    gpu_instance: int
    compute_instance: int | None


@dataclass
class CdiIndex:
    """Every CDI device of the readable specs, by fully qualified name, and the MIG minors."""

    devices: dict[str, DeviceNodes] = field(default_factory=dict)
    mig_minors: dict[int, MigMinor] = field(default_factory=dict)
    specs_read: int = 0

    def nodes(self, qualified_name: str) -> DeviceNodes | None:
        return self.devices.get(qualified_name)


@dataclass
class _Cached:
    stamp: tuple[int, int]  # (mtime_ns, size)
    devices: dict[str, DeviceNodes]


@dataclass
class CdiReader:
    """Reads the spec directories and the mig-minors file; parses a spec again only if changed.

    ``mig-minors`` lists every possible GPU and compute instance of the driver's lifetime (some
    4300 lines): it is read again only after ``mig_minors_ttl`` seconds, or while it gave
    nothing.
    """

    spec_dirs: Sequence[Path]
    mig_minors_path: Path
    mig_minors_ttl: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _cache: dict[Path, _Cached] = field(default_factory=dict)
    _mig_minors: dict[int, MigMinor] = field(default_factory=dict)
    _mig_minors_read: float | None = None

    def read(self) -> CdiIndex:
        index = CdiIndex(mig_minors=self._minors())
        seen: set[Path] = set()
        for path in _spec_files(self.spec_dirs):
            devices = self._spec(path)
            if devices is None:
                continue
            seen.add(path)
            index.specs_read += 1
            for name, nodes in devices.items():
                index.devices.setdefault(name, nodes)  # the first directory wins, as in CDI
        self._cache = {p: c for p, c in self._cache.items() if p in seen}
        return index

    def _minors(self) -> dict[int, MigMinor]:
        now = self.clock()
        last = self._mig_minors_read
        if not self._mig_minors or last is None or now - last >= self.mig_minors_ttl:
            self._mig_minors, self._mig_minors_read = read_mig_minors(self.mig_minors_path), now
        return self._mig_minors

    def _spec(self, path: Path) -> dict[str, DeviceNodes] | None:
        try:
            info = path.stat()
            stamp = (info.st_mtime_ns, info.st_size)
            cached = self._cache.get(path)
            if cached is not None and cached.stamp == stamp:
                return cached.devices
            if info.st_size > _MAX_SPEC_BYTES:
                return None
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        devices = parse_spec(text, json_format=path.suffix == ".json")
        if devices is not None:
            self._cache[path] = _Cached(stamp, devices)
        return devices


def _spec_files(spec_dirs: Iterable[Path]) -> Iterable[Path]:
    for directory in spec_dirs:
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            continue  # absent or unreadable: nothing to learn there
        yield from (p for p in entries if p.suffix in _SPEC_SUFFIXES)


def parse_spec(text: str, *, json_format: bool = False) -> dict[str, DeviceNodes] | None:
    """``{"vendor/class=name": nodes}`` for one spec's devices; None if it is no CDI spec."""
    try:
        spec = json.loads(text) if json_format else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError):
        return None
    if not isinstance(spec, Mapping) or not isinstance(spec.get("kind"), str):
        return None
    devices = spec.get("devices")
    if not isinstance(devices, list):
        return None
    kind = spec["kind"]
    found: dict[str, DeviceNodes] = {}
    for device in devices:
        if isinstance(device, Mapping) and isinstance(device.get("name"), str):
            found[f"{kind}={device['name']}"] = _device_nodes(device.get("containerEdits"))
    return found


def _device_nodes(edits: Any) -> DeviceNodes:
    nodes = edits.get("deviceNodes") if isinstance(edits, Mapping) else None
    gpus: list[int] = []
    caps: list[int] = []
    for node in nodes if isinstance(nodes, list) else ():
        if not isinstance(node, Mapping) or not isinstance(node.get("path"), str):
            continue
        if match := _GPU_NODE.match(node["path"]):
            gpus.append(int(match[1]))
        elif match := _CAP_NODE.match(node["path"]):
            minor = node.get("minor")  # explicit in NVIDIA's specs; else the name's number
            caps.append(minor if isinstance(minor, int) else int(match[1]))
    return DeviceNodes(tuple(gpus), tuple(caps))


def read_mig_minors(path: Path) -> dict[int, MigMinor]:
    """Capability minor -> what it grants, from ``mig-minors``; empty if it cannot be read."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return {}
    return parse_mig_minors(text)


def parse_mig_minors(text: str) -> dict[int, MigMinor]:
    """Lines ``gpu0/gi1/access 12`` and ``gpu0/gi1/ci0/access 13``; others are ignored."""
    minors: dict[int, MigMinor] = {}
    for line in text.splitlines():
        match = _MIG_MINOR.match(line.strip())
        if match:
            ci = int(match[3]) if match[3] is not None else None
            minors[int(match[4])] = MigMinor(int(match[1]), int(match[2]), ci)
    return minors
