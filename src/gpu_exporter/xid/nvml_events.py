"""The NVML event thread: Xid critical errors from every GPU, through the real pynvml API.

One event set holds every whole GPU (MIG instances report through their parent, with the
instance in ``gpuInstanceId``). Waits are bounded (``wait_ms``) so a stop is seen promptly, and
the set is rebuilt whenever the device inventory changes (a GPU lost or back after a reset,
MIG reconfigured) or a wait fails (GpuIsLost: a GPU in the set dropped): NVML delivers only
events that happen while registered, and a recovered GPU has a new handle.

A rebuild first drains what the old set still holds (the other GPUs' Xids queued meanwhile), then
registers the new one at once: only the first of consecutive failures rebuilds without a pause,
so a set that fails every wait cannot spin. The GPUs that still answer keep their NVML events
through another GPU's loss (the soak found them dropped for a second).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from ..devices import Device, DeviceId
from ..logs import RateLimitedLog, get_logger
from ..nvml import error_name

NO_INSTANCE = 0xFFFFFFFF
RETRY_S = 30.0
FAILED_WAIT_BACKOFF_S = 1.0  # after a second failure in a row
MAX_DRAINED = 1024  # events read from a set being replaced; more means it never empties

_log = get_logger("xid.nvml_events")


@dataclass(frozen=True)
class Inventory:
    """The devices as last seen on the event loop, indexed for the reader threads."""

    version: int = 0
    gpus: tuple[Device, ...] = ()  # whole GPUs, with their NVML handles
    by_bus: dict[str, DeviceId] = field(default_factory=dict)  # normalised bus id -> GPU
    by_uuid: dict[str, DeviceId] = field(default_factory=dict)  # every device
    mig: dict[tuple[str, int], DeviceId] = field(default_factory=dict)  # (GPU uuid, GI id)

    def mig_device(self, gpu_uuid: str, gpu_instance_id: int | None) -> DeviceId | None:
        if gpu_instance_id is None:
            return None
        return self.mig.get((gpu_uuid, gpu_instance_id))


XidCallback = Callable[[int, DeviceId | None, int | None, float], None]


class NvmlEventThread:
    """Calls ``on_xid(xid, device, gpu_instance_id, wall_time)`` on its own thread."""

    def __init__(
        self,
        inventory: Callable[[], Inventory],
        on_xid: XidCallback,
        *,
        on_up: Callable[[bool], None],
        wait_ms: int = 250,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._inventory = inventory
        self._on_xid = on_xid
        self._on_up = on_up
        self._wait_ms = wait_ms
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rlog = RateLimitedLog(_log, period=300.0)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="xid-nvml-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Blocking (up to one wait): call off the event loop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        failed_before = False  # the previous set ended on a failed wait
        while not self._stop.is_set():
            inventory = self._inventory()
            try:
                event_set = pynvml.nvmlEventSetCreate()
            except pynvml.NVMLError as exc:
                self._failed("nvmlEventSetCreate", exc)
                self._stop.wait(RETRY_S)
                continue
            failed = False
            try:
                registered = self._register(event_set, inventory)
                self._on_up(bool(registered))
                if registered:
                    failed = self._wait(event_set, registered, inventory.version)
                    self._drain(event_set, registered)
                else:
                    self._idle_until_changed(inventory.version)
            except Exception:  # a bug here must not end Xid capture for good
                _log.exception("NVML event thread failed; restarting it")
                self._on_up(False)
                self._stop.wait(1.0)
            finally:
                try:
                    pynvml.nvmlEventSetFree(event_set)
                except pynvml.NVMLError as exc:
                    self._failed("nvmlEventSetFree", exc)
            if failed and failed_before:
                self._stop.wait(FAILED_WAIT_BACKOFF_S)
            failed_before = failed
        self._on_up(False)

    def _register(self, event_set: Any, inventory: Inventory) -> dict[int, DeviceId]:
        registered: dict[int, DeviceId] = {}
        for device in inventory.gpus:
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(device.handle)
                if not int(supported) & pynvml.nvmlEventTypeXidCriticalError:
                    continue
                pynvml.nvmlDeviceRegisterEvents(
                    device.handle, pynvml.nvmlEventTypeXidCriticalError, event_set
                )
            except pynvml.NVMLError as exc:
                self._failed("nvmlDeviceRegisterEvents", exc, uuid=device.uuid)
                continue
            registered[_address(device.handle)] = device.id
        return registered

    def _wait(self, event_set: Any, registered: dict[int, DeviceId], version: int) -> bool:
        """Deliver events until stop or an inventory change (False), or a failed wait (True:
        GpuIsLost and friends; the rebuilt set leaves out a GPU that cannot register)."""
        while not self._stop.is_set() and self._inventory().version == version:
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, self._wait_ms)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as exc:
                self._failed("nvmlEventSetWait_v2", exc)
                return True
            if int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                self._deliver(data, registered)
        return False

    def _drain(self, event_set: Any, registered: dict[int, DeviceId]) -> None:
        """Deliver what a set about to be freed still holds, without waiting."""
        lost_reports = 0
        for _ in range(MAX_DRAINED):
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, 0)
            except pynvml.NVMLError_GpuIsLost:
                # A lost GPU's report; the others' events may follow it (at most one each).
                lost_reports += 1
                if lost_reports > len(registered):
                    return
                continue
            except pynvml.NVMLError:
                return  # Timeout: empty (or a failure: nothing more to read)
            if int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                self._deliver(data, registered)

    def _deliver(self, data: Any, registered: dict[int, DeviceId]) -> None:
        arrival = self._clock()
        gpu = registered.get(_address(data.device)) or self._by_uuid(data.device)
        instance = int(data.gpuInstanceId)
        gpu_instance = None if instance == NO_INSTANCE else instance
        device = None
        if gpu is not None:
            device = self._inventory().mig_device(gpu.uuid, gpu_instance) or gpu
        self._on_xid(int(data.eventData), device, gpu_instance, arrival)

    def _by_uuid(self, handle: Any) -> DeviceId | None:
        try:
            uuid = pynvml.nvmlDeviceGetUUID(handle)
        except pynvml.NVMLError as exc:
            self._failed("nvmlDeviceGetUUID", exc)
            return None
        text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return self._inventory().by_uuid.get(text)

    def _idle_until_changed(self, version: int) -> None:
        while not self._stop.is_set() and self._inventory().version == version:
            self._stop.wait(1.0)

    def _failed(self, function: str, exc: pynvml.NVMLError, **fields: Any) -> None:
        self._rlog.warning(
            (function, error_name(exc)),
            "NVML event call failed",
            function=function,
            error=error_name(exc),
            **fields,
        )


def _address(handle: Any) -> int:
    """Device handles are ctypes pointers: unhashable, new objects per call; key by address."""
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
