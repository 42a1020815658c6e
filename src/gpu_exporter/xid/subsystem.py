"""``XidSubsystem``: the sampler's SampleSource and DeviceListener for Xids and drain latches.

Threads: the kernel-log reader and the NVML event thread feed :class:`XidCore`; device listener
calls (made on the event loop) go to a single control thread, because they write the journal.
The event loop only reads: ``samples()`` re-renders from the core's immutable snapshot when it
changed, and keeps the device index the readers use up to date.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..config import Config
from ..devices import Device, DeviceId
from ..exposition import Family, Sample, counter, gauge, label_string
from ..families import SOURCE_UP, source_up
from ..logs import get_logger
from .bounds import FOLDED_LABELS
from .classes import CLASSES, Classifier, load_classifier
from .core import (
    IGNORED_REASONS,
    SOURCE_KMSG,
    SOURCE_NVML,
    HolderLookup,
    KmsgMark,
    KmsgPosition,
    Observation,
    Published,
    SxidObservation,
    XidCore,
)
from .journal import Journal, Write
from .kmsg import (
    SYSLOG_POLL_S,
    Batch,
    Klogctl,
    KmsgReader,
    KmsgSyscalls,
    ReadAll,
)
from .lines import offset_problem
from .nvml_events import Inventory, NvmlEventThread
from .parser import (
    FallenOffBusTracker,
    KmsgRecord,
    XidLine,
    normalize_bus_id,
    parse_sxid,
    parse_xid,
    text_hash,
)
from .state import REASONS

XID_ERRORS = counter(
    "gpu_xid_errors_total",
    "Xid errors by device, code, class (hardware|application|driver|informational|unknown), "
    "NVIDIA's immediate action, and the namespace/pod that held the device (empty if none).",
)
XID_CLASS_ERRORS = counter(
    "gpu_xid_class_errors_total",
    "Xid errors by device and class; every class is published at 0 for every device so that "
    "increase() sees the first Xid.",
)
XID_LAST = gauge(
    "gpu_xid_last_timestamp_seconds",
    "When the latest Xid of this code happened on this device, in seconds since the epoch.",
)
DRAIN = gauge(
    "gpu_drain_recommended",
    "1 while a hardware condition stands on the GPU (reason: hardware_xid, row_remap_failure, "
    "device_lost); survives exporter restarts, clears on a new boot or an observed GPU reset.",
)
JOURNAL_OK = gauge(
    "gpu_exporter_state_journal_ok",
    "1 when the Xid journal under --state-dir holds the whole state: it loaded cleanly (or was "
    "rewritten since) and its last write succeeded.",
)
JOURNAL_ERRORS = counter(
    "gpu_exporter_state_journal_errors_total",
    "Failed Xid journal operations (load: unreadable or corrupt at start; append, snapshot: "
    "write failures such as a full or read-only disk), by operation.",
)
JOURNAL_OPERATIONS = ("load", "append", "snapshot")
DUPLICATES = counter(
    "gpu_exporter_xid_duplicates_total",
    "Xid reports dropped because another source already counted the same event, by source.",
)
KMSG_LOST = counter(
    "gpu_exporter_kmsg_lost_records_total",
    "Kernel log records overwritten before the exporter read them (sequence number gaps).",
)
IGNORED = counter(
    "gpu_exporter_kmsg_ignored_records_total",
    "Kernel log records not taken as Xid sources, by reason: not_kernel (written by a userspace "
    "process, which only the kernel facility is not; counted when it names an Xid or SXid), "
    "oversized (a file or FIFO line longer than the kernel's longest record, dropped).",
)
FOLDED = counter(
    "gpu_exporter_xid_label_values_folded_total",
    'Xids and SXids counted under "other" because a label had too many values: label xid (an '
    "unknown code beyond the GPU's first 8), sxid (beyond an NVSwitch's first 64 codes), "
    "pci_bus_id (beyond 16 NVSwitches). The raw values are in the events' log lines.",
)
UNPARSED = counter(
    "gpu_exporter_xid_unparsed_lines_total",
    "Kernel log lines that mention an Xid or an NVSwitch SXid but could not be parsed.",
)
SXID_ERRORS = counter(
    "gpu_nvswitch_sxid_errors_total",
    "NVSwitch SXid errors from the kernel log, by switch instance, the switch's PCI address, "
    "code and severity (fatal|non_fatal|correctable|unknown).",
)
SXID_LAST = gauge(
    "gpu_nvswitch_sxid_last_timestamp_seconds",
    "When the latest SXid of this code and severity happened on this NVSwitch, in seconds since "
    "the epoch.",
)
FAMILIES: tuple[Family, ...] = (
    XID_ERRORS,
    XID_CLASS_ERRORS,
    XID_LAST,
    DRAIN,
    SXID_ERRORS,
    SXID_LAST,
    SOURCE_UP,
    JOURNAL_OK,
    JOURNAL_ERRORS,
    DUPLICATES,
    KMSG_LOST,
    IGNORED,
    FOLDED,
    UNPARSED,
)
COUNT_LABELS = ("gpu", "uuid", "xid", "class", "action", "namespace", "pod")
SXID_LABELS = ("switch", "pci_bus_id", "sxid", "severity")
_XID_WORD = re.compile(r"(?<![A-Za-z])Xid\b")
_SXID_WORD = re.compile(r"\bSXid\b")
BOOT_ID_FILE = "sys/kernel/random/boot_id"
# LOG_KERN, and None for a plain text line (no header: a file written by hand or a test).
KERNEL_FACILITIES = frozenset({0, None})

_log = get_logger("xid")


class XidSubsystem:
    """Built from explicit parameters; nothing runs until :meth:`start`.

    Raises :class:`~gpu_exporter.xid.classes.XidClassesError` at construction for a bad
    ``classes_path`` file.

    ``kmsg_path`` ``/dev/kmsg`` falls back to the ``syslog(2)`` system call when the device
    cannot be opened (EPERM, EACCES, ENOENT); ``syslog:`` reads through ``syslog(2)`` only.
    ``syslog`` replaces the ``klogctl`` call (tests feed it buffers).
    """

    families: Sequence[Family] = FAMILIES

    def __init__(
        self,
        *,
        devices: Callable[[], Iterable[Device]],
        unidentified_lost: Callable[[], Iterable[int]] = tuple,
        kmsg_path: Path | None,
        state_dir: Path | None,
        proc_path: Path = Config.proc_path,
        classes_path: Path | None = None,
        holder: HolderLookup | None = None,
        nvml_events: bool = True,
        boot_id: str | None = None,
        clock: Callable[[], float] = time.time,
        uptime: Callable[[], float] = time.monotonic,
        dedup_window: float = 5.0,
        poll_interval: float = 0.05,
        nvml_wait_ms: int = 250,
        nvml_grace: float = 0.3,
        classifier: Classifier | None = None,
        on_change: Callable[[], None] | None = None,
        syslog: ReadAll | None = None,
        syslog_poll: float = SYSLOG_POLL_S,
        housekeeping_interval: float = 10.0,
        journal_write: Write = os.write,
        pod_series_retention: float | None = None,
        kmsg_syscalls: KmsgSyscalls | None = None,
    ) -> None:
        self.classifier = classifier or load_classifier(classes_path)
        self._devices = devices
        self._unidentified_lost = unidentified_lost
        self._kmsg_path = kmsg_path
        self._proc = proc_path
        self._nvml_enabled = nvml_events
        self._boot_id = boot_id or ""
        self._clock = clock
        self._uptime = uptime
        self._poll = poll_interval
        self._nvml_wait_ms = nvml_wait_ms
        self._nvml_grace = nvml_grace
        self._holder = holder
        self._syslog = syslog
        self._syslog_poll = syslog_poll
        self._housekeeping_interval = housekeeping_interval
        self._pod_series_retention = pod_series_retention
        self._kmsg_syscalls = kmsg_syscalls or KmsgSyscalls()
        self._housekeeper: asyncio.Task[None] | None = None
        self.core = XidCore(
            self.classifier,
            Journal(state_dir, write=journal_write),
            holder=holder,
            window=dedup_window,
            clock=clock,
        )
        self._inventory = Inventory()
        self._inventory_ids: tuple[DeviceId, ...] | None = None
        self._up: dict[str, bool] = {}
        if kmsg_path is not None:
            self._up[SOURCE_KMSG] = False
        if nvml_events:
            self._up[SOURCE_NVML] = False
        self._offset: float | None = None  # wall time of kernel usec 0 (kmsg thread only)
        self._tracker = FallenOffBusTracker()  # kmsg thread only
        self._kmsg: KmsgReader | None = None
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
        if self._holder is not None:
            self.core.holder = LoopHolder(self._holder, self._loop)
        if self._on_change is not None:
            self.core.on_publish = self._schedule_change
        self._refresh_inventory()
        if not self._boot_id:
            self._boot_id = await asyncio.to_thread(read_boot_id, self._proc)
        await asyncio.to_thread(self.core.load, self._boot_id)
        answering = [device.uuid for device in self._inventory.gpus]
        await asyncio.to_thread(self.core.clear_lost_that_answer, answering)
        boot_id, _seq, offset = self.core.kmsg_position()
        # Kernel time -> wall time: the last anchor from this boot, else now minus uptime.
        self._offset = offset if boot_id == self._boot_id and offset is not None else None
        if self._offset is None:
            self._offset = self._clock() - self._uptime()
        self._control = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xid-control")
        self._housekeeper = asyncio.create_task(self._housekeeping(), name="xid-housekeeping")
        if self._kmsg_path is not None:
            self._kmsg = KmsgReader(
                self._kmsg_path,
                self._on_kmsg,
                on_up=lambda up: self._set_up(SOURCE_KMSG, up),
                on_lost=self.core.note_lost_records,
                poll_interval=self._poll,
                clock=self._clock,
                syslog=self._syslog or Klogctl(),
                syslog_poll=self._syslog_poll,
                opener=self._kmsg_syscalls.open,
                read=self._kmsg_syscalls.read,
                on_file=self._check_file,
                on_oversized=functools.partial(self.core.note_ignored, "oversized"),
            )
            self._kmsg.start()
        if self._nvml_enabled:
            self._nvml = NvmlEventThread(
                lambda: self._inventory,
                self._on_nvml_xid,
                on_up=lambda up: self._set_up(SOURCE_NVML, up),
                wait_ms=self._nvml_wait_ms,
                clock=self._clock,
            )
            self._nvml.start()
        _log.info(
            "xid capture started",
            kmsg_path=str(self._kmsg_path) if self._kmsg_path else None,
            syslog_fallback=self._kmsg.syslog_fallback if self._kmsg else None,
            nvml_events=self._nvml_enabled,
            boot_id=self._boot_id,
        )

    async def _housekeeping(self) -> None:
        """Every interval: while the journal is failing (disk full, read-only, corrupt at start),
        try to write it again, so it recovers even when no Xid arrives to trigger a write; and
        withdraw the series of pods whose latest Xid is older than the retention."""
        while True:
            await asyncio.sleep(self._housekeeping_interval)
            if not self.core.published.journal_ok:
                self._control_call(self.core.repair_journal)
            if self._pod_series_retention is not None:
                self._control_call(self.core.expire_pod_series, self._pod_series_retention)

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
        self._control_call(self.core.set_latch, _gpu_uuid(gpu), str(gpu.index), "device_lost")

    def device_recovered(self, gpu: DeviceId) -> None:
        """A GPU confirmed lost answers again: it was reset (or the node rebooted), so drains
        clear. (A call that answered GpuIsLost while the GPU could still be looked up never
        made it lost: see the sampler's probe.)"""
        self._refresh_inventory(force=True)
        self._control_call(self.core.clear_latches, _gpu_uuid(gpu), "gpu reset observed")

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
            self.core.set_latch, _gpu_uuid(device), str(device.index), "row_remap_failure"
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
            self._rendered = self._render(published, unidentified)
            self._rendered_key = key
        return self._rendered

    def _render(self, published: Published, unidentified: tuple[int, ...]) -> list[Sample]:
        out = [
            Sample(XID_ERRORS, label_string(zip(COUNT_LABELS, key, strict=True)), value)
            for key, value in sorted(published.counts.items())
        ]
        out += self._class_samples(published)
        out += [
            Sample(SXID_ERRORS, label_string(zip(SXID_LABELS, key, strict=True)), value)
            for key, value in sorted(published.sxid_counts.items())
        ]
        out += [
            Sample(SXID_LAST, label_string(zip(SXID_LABELS, key, strict=True)), value)
            for key, value in sorted(published.sxid_last.items())
        ]
        out += [
            Sample(XID_LAST, label_string(zip(COUNT_LABELS[:4], key, strict=True)), value)
            for key, value in sorted(published.last_seen.items())
        ]
        out += self._drain_samples(published)
        out += _unidentified_drain_samples(published, unidentified)
        for source, up in sorted(self._up.items()):
            out.append(source_up(source, up))
        out.append(Sample(JOURNAL_OK, "", 1.0 if published.journal_ok else 0.0))
        for operation in JOURNAL_OPERATIONS:
            labels = label_string({"operation": operation})
            out.append(Sample(JOURNAL_ERRORS, labels, published.journal_errors.get(operation, 0.0)))
        for source in (SOURCE_KMSG, SOURCE_NVML):
            labels = label_string({"source": source})
            out.append(Sample(DUPLICATES, labels, published.duplicates.get(source, 0.0)))
        if SOURCE_KMSG in self._up:
            out.append(Sample(KMSG_LOST, "", published.kmsg_lost))
            for reason in IGNORED_REASONS:
                labels = label_string({"reason": reason})
                out.append(Sample(IGNORED, labels, published.ignored.get(reason, 0.0)))
            out.append(Sample(UNPARSED, "", published.unparsed))
        for label in FOLDED_LABELS:
            labels = label_string({"label": label})
            out.append(Sample(FOLDED, labels, published.folded.get(label, 0.0)))
        return out

    def _class_samples(self, published: Published) -> list[Sample]:
        keys = {
            (str(device.index), device.uuid, xid_class)
            for device in self._inventory.by_uuid.values()
            for xid_class in CLASSES
        }
        keys.update(published.class_counts)
        return [
            Sample(
                XID_CLASS_ERRORS,
                label_string({"gpu": gpu, "uuid": uuid, "class": xid_class}),
                published.class_counts.get((gpu, uuid, xid_class), 0.0),
            )
            for gpu, uuid, xid_class in sorted(keys)
        ]

    def _drain_samples(self, published: Published) -> list[Sample]:
        latched = {(uuid, reason) for uuid, _gpu, reason in published.latches}
        gpus = {device.uuid: str(device.id.index) for device in self._inventory.gpus}
        for uuid, gpu, _reason in published.latches:
            gpus.setdefault(uuid, gpu)  # a latched GPU no longer in the inventory stays visible
        return [
            Sample(
                DRAIN,
                label_string({"gpu": gpu, "uuid": uuid, "reason": reason}),
                1.0 if (uuid, reason) in latched else 0.0,
            )
            for uuid, gpu in sorted(gpus.items(), key=lambda item: (item[1], item[0]))
            for reason in REASONS
        ]

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

    # -- the kernel-log thread ---------------------------------------------------------------------

    def _check_file(self, file_key: str, fd: int) -> None:
        """A regular file was (re)opened: is the saved offset in it still good?"""
        saved, offset, digest = self.core.kmsg_file()
        if saved != file_key or offset <= 0:
            return
        why = offset_problem(fd, offset, digest)
        if why is not None:
            self.core.restart_kmsg_file(file_key, why)

    def _on_kmsg(self, batch: Batch) -> None:
        observations: list[Observation | SxidObservation] = []
        replay_start = 0
        if batch.marks is not None and not batch.live:
            # syslog(2): no sequence numbers; the journal's mark says where the last run stopped.
            replay_start = self.core.kmsg_replay_start(self._boot_id, batch.marks)
            if replay_start:
                _log.info(
                    "kernel log replay: records handled before a restart skipped",
                    skipped=replay_start,
                    records=len(batch.records),
                )
        for index, record in enumerate(batch.records):
            if record.facility not in KERNEL_FACILITIES:
                # Userspace may write /dev/kmsg (any process with the device, as root): the
                # kernel gives those records facility LOG_USER or higher, never 0.
                if "NVRM" in record.message or "SXid" in record.message:
                    self.core.note_ignored("not_kernel", record.message)
                continue
            position = self._position(batch, index, record)
            if batch.marks is not None:
                if index < replay_start:
                    continue  # handled before a restart
            elif not batch.live and self.core.kmsg_seen(
                position, record.usec, functools.partial(text_hash, record.message)
            ):
                continue  # handled before a restart: the ring buffer (or file) replays it
            if batch.live and record.usec is not None:
                self._offset = batch.arrival - record.usec / 1e6
            position = (*position[:2], self._offset, *position[3:])
            message = record.message
            line = parse_xid(message) or self._tracker.feed(message)
            if line is not None:
                observation = self._kmsg_observation(
                    line, record, batch, position, self._mark(batch, index, record)
                )
                observations.append(observation)
            elif (sxid := parse_sxid(message)) is not None:
                if sxid.detail:
                    continue  # the "Severity ..." / "Data {...}" lines of the report before
                when = self._event_time(record, batch)
                mark = self._mark(batch, index, record)
                observations.append(SxidObservation(sxid, when, message, position, mark))
            elif _mentions_xid(message):
                self.core.note_unparsed(message)
        self.core.observe(observations)

    @staticmethod
    def _mark(batch: Batch, index: int, record: KmsgRecord) -> KmsgMark | None:
        """The record's identity for a later syslog(2) replay: its own from syslog(2); from
        /dev/kmsg (or a FIFO) its usec and text, so either mechanism resumes where the other
        stopped. None for a regular file (identified by offset)."""
        if batch.marks is not None:
            return batch.marks[index]
        if batch.file_key is not None or record.usec is None:
            return None
        return (record.usec, text_hash(record.message), 0)

    def _position(self, batch: Batch, index: int, record: KmsgRecord) -> KmsgPosition:
        end = batch.ends[index] if batch.ends is not None else None
        return (self._boot_id, record.seq, self._offset, batch.file_key, end)

    def _event_time(self, record: KmsgRecord, batch: Batch) -> float:
        if record.usec is None or self._offset is None:
            return batch.arrival
        # Never in the future: a replayed record's anchor is only an estimate.
        return min(self._offset + record.usec / 1e6, batch.arrival)

    def _kmsg_observation(
        self,
        line: XidLine,
        record: KmsgRecord,
        batch: Batch,
        position: KmsgPosition,
        mark: KmsgMark | None,
    ) -> Observation:
        inventory = self._inventory
        gpu = inventory.by_bus.get(line.bus_id)
        device = gpu
        if gpu is not None:
            device = inventory.mig_device(gpu.uuid, line.gpu_instance_id) or gpu
        return Observation(
            source=SOURCE_KMSG,
            channel="kmsg_fallen" if line.fallen_off_bus else "kmsg",
            xid=line.xid,
            when=self._event_time(record, batch),
            device=device,
            gpu_uuid=gpu.uuid if gpu is not None else "",
            bus_id=line.bus_id,
            pid=line.pid,
            process_name=line.process_name,
            text=line.text,
            raw=record.message,
            details=line.details,
            kmsg=position,
            kmsg_mark=mark,
        )

    # -- the NVML event thread ---------------------------------------------------------------------

    def _on_nvml_xid(
        self, xid: int, device: DeviceId | None, gpu_instance: int | None, arrival: float
    ) -> None:
        kmsg = self._kmsg
        if kmsg is not None and self._up.get(SOURCE_KMSG):
            # Let the kernel log report it first: its line names the process and MIG instance.
            kmsg.wait_drained(self._nvml_grace)
        bus_id = normalize_bus_id(device.pci_bus_id) if device is not None else None
        instance = f" gpuInstanceId={gpu_instance}" if gpu_instance is not None else ""
        observation = Observation(
            source=SOURCE_NVML,
            channel="nvml",
            xid=xid,
            when=arrival,
            device=device,
            gpu_uuid=_gpu_uuid(device) if device is not None else "",
            bus_id=bus_id or "",
            raw=f"NVML XidCriticalError eventData={xid}{instance}",
        )
        self.core.observe([observation])


class LoopHolder:
    """Runs the holder lookup on the event loop, where the allocation state it reads changes.

    The reader thread waits for the answer (bounded); the loop only runs a dict lookup.
    """

    def __init__(
        self, holder: HolderLookup, loop: asyncio.AbstractEventLoop, timeout: float = 1.0
    ) -> None:
        self._holder = holder
        self._loop = loop
        self._timeout = timeout

    def holder(self, uuid: str, at_wall_time: float, pid: int | None) -> tuple[str, str] | None:
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            return self._holder.holder(uuid, at_wall_time, pid)
        answer: concurrent.futures.Future[tuple[str, str] | None] = concurrent.futures.Future()

        def lookup() -> None:
            try:
                answer.set_result(self._holder.holder(uuid, at_wall_time, pid))
            except Exception as exc:  # delivered to the waiting thread, which logs it
                answer.set_exception(exc)

        self._loop.call_soon_threadsafe(lookup)
        return answer.result(self._timeout)


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


def _gpu_uuid(device: DeviceId) -> str:
    return device.parent_uuid or device.uuid


def _mentions_xid(message: str) -> bool:
    """A line that names an Xid or an SXid but did not parse (cheap tests first: this runs on
    every kernel-log line that is not one)."""
    if "NVRM" in message and _XID_WORD.search(message):
        return True
    return "SXid" in message and _SXID_WORD.search(message) is not None


def _unidentified_drain_samples(published: Published, unidentified: Iterable[int]) -> list[Sample]:
    """``device_lost`` for GPUs lost since startup, under ``uuid=""``: without it a node whose GPU
    died before the exporter first saw it (a reboot clears the latches) would show no drain.
    Skipped for an index a journal latch already names: the same GPU in this boot."""
    named = {gpu for _uuid, gpu, _reason in published.latches}
    return [
        Sample(
            DRAIN,
            label_string({"gpu": str(index), "uuid": "", "reason": reason}),
            1.0 if reason == "device_lost" else 0.0,
        )
        for index in unidentified
        if str(index) not in named
        for reason in REASONS
    ]


def _same_key(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return a[0] is b[0] and a[1:] == b[1:]
