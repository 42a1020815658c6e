"""Ingest: kernel-log batches and NVML Xid events into observations for :class:`XidCore`.

Runs on the reader threads (the kernel-log reader's and the NVML event thread's); what it reads
of the rest (the device inventory) is an immutable snapshot the event loop swaps in.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from ..devices import DeviceId
from ..logs import get_logger
from .core import (
    SOURCE_KMSG,
    SOURCE_NVML,
    Observation,
    SxidObservation,
    XidCore,
)
from .kmsg import Batch
from .lines import offset_problem
from .nvml_events import Inventory
from .ops import KmsgMark, KmsgPosition
from .parser import (
    FallenOffBusTracker,
    KmsgRecord,
    XidLine,
    normalize_bus_id,
    parse_sxid,
    parse_xid,
    text_hash,
)

_XID_WORD = re.compile(r"(?<![A-Za-z])Xid\b")
_SXID_WORD = re.compile(r"\bSXid\b")
# LOG_KERN, and None for a plain text line (no header: a file written by hand or a test).
KERNEL_FACILITIES = frozenset({0, None})

_log = get_logger("xid")


class Ingest:
    """``boot_id`` and ``offset`` (wall time of kernel usec 0) are set by the subsystem at start,
    then owned by the kernel-log thread."""

    def __init__(
        self,
        core: XidCore,
        inventory: Callable[[], Inventory],
        wait_for_kmsg: Callable[[], None],
    ) -> None:
        self.core = core
        self.boot_id = ""
        self.offset: float | None = None
        self._inventory = inventory
        self._wait_for_kmsg = wait_for_kmsg
        self._tracker = FallenOffBusTracker()

    # -- the kernel-log thread ---------------------------------------------------------------------

    def check_file(self, file_key: str, fd: int) -> None:
        """A regular file was (re)opened: is the saved offset in it still good?"""
        saved, offset, digest = self.core.kmsg_file()
        if saved != file_key or offset <= 0:
            return
        why = offset_problem(fd, offset, digest)
        if why is not None:
            self.core.restart_kmsg_file(file_key, why)

    def on_kmsg(self, batch: Batch) -> None:
        observations: list[Observation | SxidObservation] = []
        replay_start = 0
        if batch.marks is not None and not batch.live:
            # syslog(2): no sequence numbers; the journal's mark says where the last run stopped.
            replay_start = self.core.kmsg_replay_start(self.boot_id, batch.marks)
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
                self.offset = batch.arrival - record.usec / 1e6
            position = position._replace(offset=self.offset)
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
        return KmsgMark(record.usec, text_hash(record.message), 0)

    def _position(self, batch: Batch, index: int, record: KmsgRecord) -> KmsgPosition:
        end = batch.ends[index] if batch.ends is not None else None
        return KmsgPosition(self.boot_id, record.seq, self.offset, batch.file_key, end)

    def _event_time(self, record: KmsgRecord, batch: Batch) -> float:
        if record.usec is None or self.offset is None:
            return batch.arrival
        # Never in the future: a replayed record's anchor is only an estimate.
        return min(self.offset + record.usec / 1e6, batch.arrival)

    def _kmsg_observation(
        self,
        line: XidLine,
        record: KmsgRecord,
        batch: Batch,
        position: KmsgPosition,
        mark: KmsgMark | None,
    ) -> Observation:
        inventory = self._inventory()
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

    def on_nvml_xid(
        self, xid: int, device: DeviceId | None, gpu_instance: int | None, arrival: float
    ) -> None:
        # Let the kernel log report it first: its line names the process and MIG instance.
        self._wait_for_kmsg()
        bus_id = normalize_bus_id(device.pci_bus_id) if device is not None else None
        instance = f" gpuInstanceId={gpu_instance}" if gpu_instance is not None else ""
        observation = Observation(
            source=SOURCE_NVML,
            channel="nvml",
            xid=xid,
            when=arrival,
            device=device,
            gpu_uuid=gpu_uuid(device) if device is not None else "",
            bus_id=bus_id or "",
            raw=f"NVML XidCriticalError eventData={xid}{instance}",
        )
        self.core.observe([observation])


def _mentions_xid(message: str) -> bool:
    """A line that names an Xid or an SXid but did not parse (cheap tests first: this runs on
    every kernel-log line that is not one)."""
    if "NVRM" in message and _XID_WORD.search(message):
        return True
    return "SXid" in message and _SXID_WORD.search(message) is not None


def gpu_uuid(device: DeviceId) -> str:
    """The whole GPU's uuid (a MIG instance's parent)."""
    return device.parent_uuid or device.uuid
