"""``XidSubsystem``: the sampler's SampleSource and DeviceListener for Xids and drain latches.

Threads: the kernel-log reader and the NVML event thread feed :class:`XidCore`, attributing each
Xid from the allocation's latest holder snapshot on their own thread; device listener calls
(made on the event loop) go to a single control thread, because they write the journal. The
event loop only reads: ``samples()`` re-renders from the core's immutable snapshot when it
changed, and keeps the device index the readers use up to date. A thread tells the loop about
news with ``call_soon_threadsafe`` and never waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..devices import Device, DeviceId
from ..exposition import Family, Sample
from ..logs import get_logger
from .classes import Classifier, load_classifier
from .core import SOURCE_KMSG, SOURCE_NVML, HolderLookup, XidCore
from .ingest import Ingest, gpu_uuid
from .journal import Journal
from .kmsg import DEVICE_PATH, SYSLOG_POLL_S, KmsgReader, KmsgSyscalls
from .metrics import FAMILIES, render
from .nvml_events import Inventory, NvmlEventThread
from .parser import normalize_bus_id
from .statedir import Write
from .syslog import Klogctl, ReadAll

BOOT_ID_FILE = "sys/kernel/random/boot_id"

_log = get_logger("xid")


@dataclass(frozen=True)
class XidSettings:
    """What the Xid subsystem is configured with (built from ``Config`` in ``app._build_xid``).

    ``kmsg_path`` None: no kernel-log source. ``/dev/kmsg`` falls back to ``syslog(2)`` when
    the device cannot be opened; ``syslog:`` reads through ``syslog(2)`` only. ``state_dir``
    None: no journal. ``boot_id`` None: read from ``proc_path``. ``pod_series_retention`` None:
    pod series are never withdrawn. ``job_holders``: the holders are Slurm jobs (their series
    say ``job_id``; they expire as pods' do)."""

    kmsg_path: Path | None = DEVICE_PATH
    state_dir: Path | None = None
    proc_path: Path = Path("/proc")
    classes_path: Path | None = None
    nvml_events: bool = True
    boot_id: str | None = None
    pod_series_retention: float | None = None
    job_holders: bool = False
    dedup_window: float = 5.0
    poll_interval: float = 0.05
    nvml_wait_ms: int = 250
    nvml_grace: float = 0.3
    syslog_poll: float = SYSLOG_POLL_S
    housekeeping_interval: float = 10.0


class XidSubsystem:
    """Built from :class:`XidSettings`; nothing runs until :meth:`start`. Raises
    :class:`~gpu_exporter.xid.classes.XidClassesError` at construction for a bad
    ``classes_path`` file.

    ``holders`` returns the allocation subsystem's latest holder snapshot; the reader threads
    call it for each Xid, so it must be safe on any thread (it hands out an immutable value).

    Stand-ins (tests): ``clock`` and ``uptime`` the wall and monotonic clocks, ``classifier``
    the one loaded from ``classes_path``, ``syslog`` the ``klogctl`` call (tests feed it
    buffers), ``journal_write`` the journal's ``os.write`` (a disk that fills up),
    ``kmsg_syscalls`` the kernel-log device's ``open`` and ``read``."""

    families: Sequence[Family] = FAMILIES

    def __init__(
        self,
        settings: XidSettings,
        *,
        devices: Callable[[], Iterable[Device]],
        unidentified_lost: Callable[[], Iterable[int]] = tuple,
        holders: Callable[[], HolderLookup] | None = None,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
        uptime: Callable[[], float] = time.monotonic,
        classifier: Classifier | None = None,
        syslog: ReadAll | None = None,
        journal_write: Write = os.write,
        kmsg_syscalls: KmsgSyscalls | None = None,
    ) -> None:
        self.settings = settings
        self.classifier = classifier or load_classifier(settings.classes_path)
        self._devices = devices
        self._unidentified_lost = unidentified_lost
        self._boot_id = settings.boot_id or ""
        self._clock = clock
        self._uptime = uptime
        self._syslog = syslog
        self._kmsg_syscalls = kmsg_syscalls or KmsgSyscalls()
        self._housekeeper: asyncio.Task[None] | None = None
        self.core = XidCore(
            self.classifier,
            Journal(settings.state_dir, write=journal_write),
            holders=holders,
            job_holders=settings.job_holders,
            window=settings.dedup_window,
            clock=clock,
        )
        self._inventory = Inventory()
        self._inventory_ids: tuple[DeviceId, ...] | None = None
        self._up: dict[str, bool] = {}
        if settings.kmsg_path is not None:
            self._up[SOURCE_KMSG] = False
        if settings.nvml_events:
            self._up[SOURCE_NVML] = False
        self._kmsg: KmsgReader | None = None
        self._ingest = Ingest(self.core, lambda: self._inventory, self._wait_for_kmsg)
        self._nvml: NvmlEventThread | None = None
        self._control: ThreadPoolExecutor | None = None
        self._on_change = on_change
        self._change_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rendered: list[Sample] = []
        self._rendered_key: tuple[Any, ...] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._on_change is not None:
            self.core.on_publish = self._schedule_change
        self._refresh_inventory()
        if not self._boot_id:
            self._boot_id = await asyncio.to_thread(read_boot_id, self.settings.proc_path)
        # After discovery (the sampler starts first): latches for GPUs the node lacks are dropped.
        on_node = gpus_on_node(self._inventory, self._unidentified_lost())
        await asyncio.to_thread(self.core.load, self._boot_id, on_node)
        answering = [device.uuid for device in self._inventory.gpus]
        await asyncio.to_thread(self.core.clear_lost_that_answer, answering)
        boot_id, _seq, offset = self.core.kmsg_position()
        # Kernel time -> wall time: the last anchor from this boot, else now minus uptime.
        anchor = offset if boot_id == self._boot_id and offset is not None else None
        self._ingest.boot_id = self._boot_id
        self._ingest.offset = self._clock() - self._uptime() if anchor is None else anchor
        self._control = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xid-control")
        self._housekeeper = asyncio.create_task(self._housekeeping(), name="xid-housekeeping")
        settings = self.settings
        if settings.kmsg_path is not None:
            self._kmsg = KmsgReader(
                settings.kmsg_path,
                self._ingest.on_kmsg,
                on_up=lambda up: self._set_up(SOURCE_KMSG, up),
                on_lost=self.core.note_lost_records,
                poll_interval=settings.poll_interval,
                clock=self._clock,
                syslog=self._syslog or Klogctl(),
                syslog_poll=settings.syslog_poll,
                opener=self._kmsg_syscalls.open,
                read=self._kmsg_syscalls.read,
                on_file=self._ingest.check_file,
                on_oversized=functools.partial(self.core.note_ignored, "oversized"),
            )
            self._kmsg.start()
        if settings.nvml_events:
            self._nvml = NvmlEventThread(
                lambda: self._inventory,
                self._on_nvml_xid,
                on_up=lambda up: self._set_up(SOURCE_NVML, up),
                wait_ms=settings.nvml_wait_ms,
                clock=self._clock,
            )
            self._nvml.start()
        _log.info(
            "xid capture started",
            kmsg_path=str(settings.kmsg_path) if settings.kmsg_path else None,
            syslog_fallback=self._kmsg.syslog_fallback if self._kmsg else None,
            nvml_events=settings.nvml_events,
            boot_id=self._boot_id,
        )

    async def _housekeeping(self) -> None:
        """Every interval: check that the journal's directory is still there (removed or replaced,
        ``journal_ok`` drops even when no Xid arrives); while the journal is failing (disk full,
        read-only, corrupt at start, the directory gone), try to write it again, so it recovers by
        itself; and withdraw the series of pods whose latest Xid is older than the retention."""
        retention = self.settings.pod_series_retention
        while True:
            await asyncio.sleep(self.settings.housekeeping_interval)
            self._control_call(self.core.repair_journal)
            if retention is not None:
                self._control_call(self.core.expire_pod_series, retention)

    async def stop(self) -> None:
        if self._housekeeper is not None:
            self._housekeeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeper
            self._housekeeper = None
        readers = [r for r in (self._kmsg, self._nvml) if r is not None]
        await asyncio.gather(*(asyncio.to_thread(r.stop) for r in readers))
        self._kmsg = self._nvml = None
        if self._control is not None:
            control, self._control = self._control, None
            await asyncio.to_thread(control.shutdown, True)
        await asyncio.to_thread(self.core.close)

    # -- DeviceListener (called on the event loop) ------------------------------------------------

    def device_lost(self, gpu: DeviceId) -> None:
        self._refresh_inventory(force=True)
        self._control_call(self.core.set_latch, gpu_uuid(gpu), str(gpu.index), "device_lost")

    def device_recovered(self, gpu: DeviceId) -> None:
        """A GPU confirmed lost answers again: it was reset (or the node rebooted), so drains
        clear. (A call that answered GpuIsLost while the GPU could still be looked up never
        made it lost: see the sampler's probe.)"""
        self._refresh_inventory(force=True)
        self._control_call(self.core.clear_latches, gpu_uuid(gpu), "gpu reset observed")

    async def clear_drain(
        self, gpu_uuid: str, reasons: Iterable[str] | None, who: str
    ) -> list[str]:
        """An operator's clear (the admin API): the latches of ``gpu_uuid`` (``reasons`` only, if
        given), journalled on the control thread like every other change; returns the reasons
        that were set and are now cleared."""
        clear = functools.partial(self.core.clear_latches, gpu_uuid, f"cleared by {who}", reasons)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._control, clear)

    def note_remap_failure(self, device: DeviceId) -> None:
        """Row remapping failed on this GPU (any thread): recommend draining it."""
        self._control_call(
            self.core.set_latch, gpu_uuid(device), str(device.index), "row_remap_failure"
        )

    def _control_call(self, fn: Callable[..., object], *args: Any) -> None:
        control = self._control
        if control is None:
            fn(*args)  # not started (tests, or a call racing stop): do it here
            return
        try:
            control.submit(fn, *args)
        except RuntimeError:  # shut down between the check and the submit
            fn(*args)

    # -- SampleSource (called on the event loop) ---------------------------------------------------

    def samples(self) -> Iterable[Sample]:
        self._refresh_inventory()
        published = self.core.published
        unidentified = tuple(self._unidentified_lost())
        key = (published, self._inventory.version, tuple(sorted(self._up.items())), unidentified)
        if self._rendered_key is None or not _same_key(key, self._rendered_key):
            self._rendered = render(published, self._inventory, self._up, unidentified)
            self._rendered_key = key
        return self._rendered

    def _set_up(self, source: str, up: bool) -> None:
        changed = self._up.get(source) is not up
        self._up[source] = up  # one writer per key; read on the loop
        if changed and self._on_change is not None:
            self._schedule_change()

    def _schedule_change(self) -> None:
        """From any thread: have ``on_change`` (e.g. an immediate re-render) run on the loop once,
        so a new Xid is served at once instead of at the next sampling round."""
        loop = self._loop
        if self._change_pending or loop is None or loop.is_closed():
            return
        self._change_pending = True
        try:
            loop.call_soon_threadsafe(self._fire_change)
        except RuntimeError:  # the loop closed in between
            self._change_pending = False

    def _fire_change(self) -> None:
        self._change_pending = False
        if self._on_change is None:
            return
        try:
            self._on_change()
        except Exception:  # the hook belongs to the caller; Xid capture goes on
            _log.exception("on_change hook failed")

    # -- inventory -------------------------------------------------------------------------------

    def _refresh_inventory(self, *, force: bool = False) -> None:
        devices = list(self._devices())
        ids = tuple(device.id for device in devices)
        if not force and ids == self._inventory_ids:
            return
        self._inventory_ids = ids
        self._inventory = build_inventory(devices, self._inventory.version + 1)

    def _on_nvml_xid(
        self, xid: int, device: DeviceId | None, gpu_instance: int | None, arrival: float
    ) -> None:
        """What the NVML event thread calls (tests call it to stand in for the thread)."""
        self._ingest.on_nvml_xid(xid, device, gpu_instance, arrival)

    def _wait_for_kmsg(self) -> None:
        """On the NVML thread: give the kernel log (when it is up) a moment to report first."""
        kmsg = self._kmsg
        if kmsg is not None and self._up.get(SOURCE_KMSG):
            kmsg.wait_drained(self.settings.nvml_grace)


def build_inventory(devices: Iterable[Device], version: int) -> Inventory:
    inventory = Inventory(version=version)
    gpus = []
    for device in devices:
        inventory.by_uuid[device.uuid] = device.id
        if device.id.is_mig:
            key = (device.gpu_uuid, device.id.gpu_instance_id or 0)
            inventory.mig.setdefault(key, device.id)  # several CIs in one GI: the first
            continue
        gpus.append(device)
        bus = normalize_bus_id(device.id.pci_bus_id)
        if bus is not None:
            inventory.by_bus[bus] = device.id
    return Inventory(version, tuple(gpus), inventory.by_bus, inventory.by_uuid, inventory.mig)


def gpus_on_node(
    inventory: Inventory, unidentified_lost: Iterable[int]
) -> Callable[[str, str], bool]:
    """``on_node(uuid, gpu)`` for :meth:`XidCore.load`: a discovered GPU's uuid, or the index of a
    GPU that has not answered since startup (lost, with no uuid to compare: a latch from earlier
    in the boot names it)."""
    uuids = {device.uuid for device in inventory.gpus}
    lost = {str(index) for index in unidentified_lost}
    return lambda uuid, gpu: uuid in uuids or gpu in lost


def read_boot_id(proc_path: Path) -> str:
    """The kernel's boot id (not namespaced, so the container's /proc is a fine fallback)."""
    for root in dict.fromkeys((proc_path, Path("/proc"))):
        try:
            text = (root / BOOT_ID_FILE).read_text("ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text:
            return text
    _log.warning(
        "no boot id; a reboot will not be detected (drain latches then clear only on GPU reset)",
        path=str(proc_path / BOOT_ID_FILE),
    )
    return "unknown"


def _same_key(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return a[0] is b[0] and a[1:] == b[1:]
