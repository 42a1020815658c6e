"""The NVML event thread: against a fake pynvml API and, when present, the simulator."""

from __future__ import annotations

import ctypes
import queue
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpu_exporter.devices import Device, DeviceId, discover_gpu
from gpu_exporter.nvml import ErrorCounter, SupportRegistry
from gpu_exporter.xid import XidSettings, XidSubsystem

from .conftest import caught_up, drain, value, wait_until, xid_count

XID = pynvml.nvmlEventTypeXidCriticalError


class FakeEvents:
    """Just the event-set calls, with real ctypes handles (pynvml's are pointers)."""

    def __init__(self) -> None:
        self.events: queue.Queue[SimpleNamespace] = queue.Queue()
        self.registered: list[int] = []
        self.sets = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(pynvml, "nvmlEventSetCreate", self.create)
        monkeypatch.setattr(pynvml, "nvmlEventSetFree", lambda event_set: None)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetSupportedEventTypes", lambda handle: XID | 0x4)
        monkeypatch.setattr(pynvml, "nvmlDeviceRegisterEvents", self.register)
        monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", self.wait)

    def create(self) -> object:
        self.sets += 1
        return object()

    def register(self, handle: Any, mask: int, event_set: object) -> None:
        self.registered.append(ctypes.cast(handle, ctypes.c_void_p).value or 0)

    def wait(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def raise_xid(self, handle: Any, xid: int, gpu_instance: int = 0xFFFFFFFF) -> None:
        # A new pointer object to the same device, as pynvml returns it.
        device = ctypes.cast(handle, ctypes.POINTER(ctypes.c_int))
        self.events.put(
            SimpleNamespace(
                device=device,
                eventType=XID,
                eventData=xid,
                gpuInstanceId=gpu_instance,
                computeInstanceId=0,
            )
        )


async def test_fake_nvml_events(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeEvents()
    fake.install(monkeypatch)
    cells = [ctypes.c_int(i) for i in range(2)]
    handles = [ctypes.pointer(cell) for cell in cells]
    gpus = [
        Device(DeviceId(index=i, uuid=f"GPU-{i}", pci_bus_id=f"00000000:{i + 1:02x}:00.0"), h)
        for i, h in enumerate(handles)
    ]
    xid = XidSubsystem(
        XidSettings(
            kmsg_path=None,
            state_dir=tmp_path / "state",
            boot_id="b",
            nvml_wait_ms=20,
        ),
        devices=lambda: gpus,
    )
    await xid.start()
    try:
        await wait_until(lambda: value(xid, "gpu_exporter_source_up", source="nvml_events") == 1)
        assert len(fake.registered) == 2
        fake.raise_xid(handles[1], 48)
        fake.raise_xid(handles[0], 999)  # NVML's "unknown Xid"
        await wait_until(lambda: xid_count(xid) == 2)
        assert value(xid, "gpu_xid_errors_total", gpu="1", uuid="GPU-1", xid="48") == 1
        assert value(xid, "gpu_xid_errors_total", gpu="0", xid="999", **{"class": "unknown"}) == 1
        assert drain(xid, "hardware_xid", gpu="1") == 1
        # A GPU coming back after a reset: the event set is rebuilt and registered again.
        xid.device_recovered(gpus[1].id)
        await wait_until(lambda: fake.sets == 2 and len(fake.registered) == 4)
        # The reset clears the latch on the control thread; the published value follows it.
        await wait_until(lambda: drain(xid, "hardware_xid", gpu="1") == 0)
    finally:
        started = time.monotonic()
        await xid.stop()
        assert time.monotonic() - started < 1.0  # bounded waits: shutdown is prompt


SCENARIO = """
node: {name: xid-node, boot_id: 3f1c2a9e-0000-4000-8000-000000000001, uptime: 100s}
gpus:
  - {model: H100-SXM-80GB, count: 2}
  - {model: H100-SXM-80GB, mig: [3g.40gb, 4g.40gb]}
workloads:
  - {gpu: 0, pod: web, namespace: prod, pid: 4242, process_name: python3, sm: 0.5}
"""


async def test_against_the_simulator(tmp_path: Path) -> None:
    try:
        from gpu_exporter.simulator import SimulatedNode, install, loads_scenario, uninstall
    except ImportError as exc:  # pragma: no cover - the simulator ships with the package
        pytest.skip(f"simulator not available: {exc}")
    node = SimulatedNode(loads_scenario(textwrap.dedent(SCENARIO), "xid.yaml"))
    install(node)
    kmsg_path = tmp_path / "kmsg"
    kmsg_path.touch()
    node.add_kmsg_file(kmsg_path)
    xid: XidSubsystem | None = None
    try:
        pynvml.nvmlInit()
        gpus = [discover_gpu(i, SupportRegistry(), ErrorCounter()) for i in range(3)]
        devices = [device for gpu in gpus for device in gpu.devices()]
        xid = XidSubsystem(
            XidSettings(
                kmsg_path=kmsg_path,
                state_dir=tmp_path / "state",
                boot_id=node.scenario.node.boot_id,
                poll_interval=0.02,
                nvml_wait_ms=50,
            ),
            devices=lambda: devices,
        )
        await xid.start()
        running = xid
        await wait_until(lambda: _up(running, "kmsg") and _up(running, "nvml_events"))
        await caught_up(running)
        node.inject({"type": "xid", "gpu": 0, "code": 13})  # both sources
        await wait_until(lambda: _duplicates(running, "nvml_events") == 1)
        assert value(xid, "gpu_xid_errors_total", gpu="0", xid="13", pod="") == 1
        node.inject({"type": "xid", "gpu": 1, "code": 48, "delivery": "nvml"})
        node.inject({"type": "xid", "gpu": 1, "code": 79})  # kernel log only
        node.inject({"type": "xid", "gpu": 2, "mig": 1, "code": 31, "delivery": "nvml"})
        await wait_until(lambda: xid_count(xid) == 4)
        by_gi = {d.id.gpu_instance_id: d.uuid for d in devices if d.id.is_mig}
        assert value(xid, "gpu_xid_errors_total", gpu="1", xid="48", **{"class": "hardware"}) == 1
        assert value(xid, "gpu_xid_errors_total", gpu="1", xid="79") == 1
        migs = node.scenario.gpus[2].mig
        assert migs is not None
        mig_instance = migs[1].gpu_instance_id
        assert value(xid, "gpu_xid_errors_total", uuid=by_gi[mig_instance], xid="31") == 1
        # An instance's application Xid counts on the node's class counter (with GPU 0's 13), the
        # one increase() watches; a hardware Xid on an instance counts on its GPU.
        application = {"gpu": "", "uuid": "", "class": "application"}
        assert value(xid, "gpu_xid_class_errors_total", **application) == 2
        node.inject({"type": "xid", "gpu": 2, "mig": 1, "code": 48, "delivery": "nvml"})
        await wait_until(lambda: xid_count(xid) == 5)
        parent = gpus[2].device.uuid
        hardware = {"class": "hardware"}
        assert value(xid, "gpu_xid_class_errors_total", uuid=parent, **hardware) == 1
        assert value(xid, "gpu_xid_class_errors_total", gpu="1", **hardware) == 2  # 48 and 79
        assert value(xid, "gpu_xid_class_errors_total", uuid=by_gi[mig_instance]) is None
    finally:
        if xid is not None:
            await xid.stop()
        uninstall()
        node.close()


def _up(xid: XidSubsystem, source: str) -> bool:
    return value(xid, "gpu_exporter_source_up", source=source) == 1


def _duplicates(xid: XidSubsystem, source: str) -> float | None:
    return value(xid, "gpu_exporter_xid_duplicates_total", source=source)


async def test_a_lost_gpu_whose_event_waits_keep_failing_does_not_stop_the_others(
    tmp_path: Path,
) -> None:
    from gpu_exporter.simulator import SimulatedNode, install, loads_scenario, uninstall

    node = SimulatedNode(loads_scenario(textwrap.dedent(SCENARIO), "xid.yaml"))
    install(node)
    xid: XidSubsystem | None = None
    try:
        pynvml.nvmlInit()
        gpus = [discover_gpu(i, SupportRegistry(), ErrorCounter()) for i in range(3)]
        devices = [device for gpu in gpus for device in gpu.devices()]
        xid = XidSubsystem(
            XidSettings(
                kmsg_path=None,
                state_dir=tmp_path / "state",
                boot_id=node.scenario.node.boot_id,
                nvml_wait_ms=50,
            ),
            devices=lambda: devices,  # the lost GPU stays in the inventory
        )
        await xid.start()
        running = xid
        await wait_until(lambda: _up(running, "nvml_events"))
        node.inject({"type": "gpu_lost", "gpu": 1})
        waits = node.calls["nvmlEventSetWait_v2"]
        node.inject({"type": "xid", "gpu": 0, "code": 48, "delivery": "nvml"})
        await wait_until(lambda: xid_count(running) == 1)
        node.inject({"type": "xid", "gpu": 2, "code": 48, "delivery": "nvml"})
        await wait_until(lambda: xid_count(running) == 2)
        spent = node.calls["nvmlEventSetWait_v2"] - waits
        assert spent < 40, f"{spent} waits: the thread spins on the lost GPU's GpuIsLost"
        assert value(xid, "gpu_xid_errors_total", gpu="0", xid="48") == 1
    finally:
        if xid is not None:
            await xid.stop()
        uninstall()
        node.close()


async def test_without_root_a_mig_xid_event_is_counted_on_its_gpu(tmp_path: Path) -> None:
    from gpu_exporter.simulator import SimulatedNode, install, loads_scenario, uninstall

    scenario = SCENARIO.replace("uptime: 100s}", "uptime: 100s, privileged: false}")
    node = SimulatedNode(loads_scenario(textwrap.dedent(scenario), "xid.yaml"))
    install(node)
    xid: XidSubsystem | None = None
    try:
        pynvml.nvmlInit()
        gpus = [discover_gpu(i, SupportRegistry(), ErrorCounter()) for i in range(3)]
        devices = [device for gpu in gpus for device in gpu.devices()]
        xid = XidSubsystem(
            XidSettings(
                kmsg_path=None,
                state_dir=tmp_path / "state",
                boot_id=node.scenario.node.boot_id,
                nvml_wait_ms=50,
            ),
            devices=lambda: devices,
        )
        await xid.start()
        running = xid
        await wait_until(lambda: _up(running, "nvml_events"))
        node.inject({"type": "xid", "gpu": 2, "mig": 1, "code": 31, "delivery": "nvml"})
        await wait_until(lambda: xid_count(running) == 1)
        # No instance ids: the event names the whole GPU, not a MIG instance.
        assert value(xid, "gpu_xid_errors_total", uuid=gpus[2].device.uuid, xid="31") == 1
    finally:
        if xid is not None:
            await xid.stop()
        uninstall()
        node.close()
