"""Helpers for the Xid tests: fake devices, a kmsg-format file writer, condition waits."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.devices import Device, DeviceId
from gpu_exporter.exposition import render
from gpu_exporter.xid import XidSettings, XidSubsystem

GPU0 = DeviceId(index=0, uuid="GPU-0000", pci_bus_id="00000000:18:00.0")
GPU1 = DeviceId(index=1, uuid="GPU-1111", pci_bus_id="00000000:3B:00.0", mig_mode="enabled")
# The make_subsystem fixture's type: plain_subsystem with the fixture's kmsg file and state dir.
Make = Callable[..., XidSubsystem]
MIG1 = DeviceId(
    index=1,
    uuid="MIG-1111-5",
    pci_bus_id="00000000:3B:00.0",
    mig_mode="enabled",
    parent_uuid="GPU-1111",
    gpu_instance_id=5,
    compute_instance_id=0,
    mig_profile="1g.10gb",
)


class FillableDisk:
    """``os.write`` on a disk that fills up: while ``error`` is set every write fails with it
    (ENOSPC full, EROFS remounted read-only), as the kernel reports either. Neither can be made
    on demand without privileges, and an open descriptor ignores later permission changes."""

    def __init__(self) -> None:
        self.error: int | None = None

    def write(self, fd: int, data: memoryview) -> int:
        if self.error is not None:
            raise OSError(self.error, os.strerror(self.error))
        return os.write(fd, data)


SETTING_NAMES = frozenset(field.name for field in dataclasses.fields(XidSettings))


def plain_subsystem(tmp_path: Path, **overrides: Any) -> XidSubsystem:
    """A subsystem on the fake devices, reading ``tmp_path/kmsg`` into ``tmp_path/state``.
    ``overrides``: :class:`XidSettings` fields and the subsystem's other arguments, by name."""
    settings: dict[str, Any] = {
        "kmsg_path": tmp_path / "kmsg",
        "state_dir": tmp_path / "state",
        "nvml_events": False,
        "boot_id": "boot-1",
        "poll_interval": 0.02,
    }
    arguments: dict[str, Any] = {"devices": fake_devices}
    for name, override in overrides.items():
        (settings if name in SETTING_NAMES else arguments)[name] = override
    return XidSubsystem(XidSettings(**settings), **arguments)


def fake_devices() -> list[Device]:
    gpu0 = Device(GPU0, None)
    gpu1 = Device(GPU1, None)
    return [gpu0, gpu1, Device(MIG1, None, gpu1)]


class KmsgFile:
    """Appends ``/dev/kmsg``-format records to a regular file, numbering them."""

    def __init__(self, path: Path, first_seq: int = 100) -> None:
        self.path = path
        self.seq = first_seq
        path.touch()

    def write(self, message: str, *, usec: int | None = None, prefix: int = 3) -> int:
        seq = self.seq
        self.seq += 1
        usec = seq * 1000 if usec is None else usec
        with self.path.open("a", encoding="utf-8") as out:
            out.write(f"{prefix},{seq},{usec},-;{message}\n")
        return seq


@pytest.fixture
def kmsg(tmp_path: Path) -> KmsgFile:
    return KmsgFile(tmp_path / "kmsg")


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


async def wait_until(predicate: Callable[[], bool], within: float = 3.0) -> None:
    """Wait for a condition a reader thread makes true (polls; there is no event to await)."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def caught_up(subsystem: XidSubsystem) -> None:
    """Wait until the kernel-log reader has read to the end once: later records are live."""
    reader = subsystem._kmsg
    assert reader is not None
    assert await asyncio.to_thread(reader.wait_drained, 3.0)


def exposition(subsystem: XidSubsystem) -> str:
    return render(subsystem.samples(), subsystem.families).text.decode()


def value(subsystem: XidSubsystem, name: str, **labels: str) -> float | None:
    """The value of the one series of ``name`` whose labels include ``labels``."""
    found = []
    for sample in subsystem.samples():
        if sample.family.name != name:
            continue
        if all(f'{k}="{v}"' in sample.labels.split(",") for k, v in labels.items()):
            found.append(sample.value)
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} series"
    return found[0] if found else None


def xid_count(subsystem: XidSubsystem) -> float:
    return sum(subsystem.core.published.counts.values())


@pytest.fixture
def make_subsystem(kmsg: KmsgFile, state_dir: Path) -> Make:
    def make(**overrides: Any) -> XidSubsystem:
        paths = {"kmsg_path": kmsg.path, "state_dir": state_dir}
        return plain_subsystem(kmsg.path.parent, **{**paths, **overrides})

    return make


def fail_next_observation(xid: XidSubsystem) -> list[int]:
    """Make the core's next non-empty observation raise once, as a handler bug would; the
    returned list gets one entry when it has."""
    observe = xid.core.observe
    failures: list[int] = []

    def fail_once(observations: Any) -> None:
        observations = list(observations)
        if observations and not failures:
            failures.append(1)
            raise RuntimeError("a handler bug")
        observe(observations)

    xid.core.observe = fail_once  # type: ignore[method-assign]
    return failures


def drain(subsystem: XidSubsystem, reason: str, **labels: str) -> float | None:
    """``gpu_drain_recommended`` for ``reason`` on the device ``labels`` pick: 1 while it stands,
    0 while it does not (the device serves no series for it), None for a device with none."""
    found = value(subsystem, "gpu_drain_recommended", reason=reason, **labels)
    if found is not None:
        return found
    device = [
        s
        for s in subsystem.samples()
        if s.family.name == "gpu_drain_recommended"
        and all(f'{k}="{v}"' in s.labels.split(",") for k, v in labels.items())
    ]
    return 0.0 if device else None
