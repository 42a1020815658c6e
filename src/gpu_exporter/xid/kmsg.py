"""A kernel-log reader thread: ``/dev/kmsg`` itself, a FIFO, or a regular file that is appended to.

- The real device returns one record per ``read()``; it is opened non-blocking and waited on with
  ``select`` so a stop is seen within one poll interval. ``EPIPE`` (records overwritten while we
  read) is counted through the sequence-number gap of the next record.
- A regular file or FIFO is read in chunks and split into lines; a partial last line waits for
  its newline. A regular file is followed like ``tail -F``: truncation or replacement reopens it.
- What is in the file at open is *replay* (the ring buffer's history); once the reader first
  reaches the end, every record is *live*. Callers use that to anchor kernel time to wall time and
  to decide what a record without a sequence number may do.

The reader only reads and splits; the handler (called on this thread) parses and counts.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..logs import RateLimiter, get_logger
from .parser import KmsgRecord, parse_record

MAX_RECORD = 16_384  # larger than the kernel's longest record (CONSOLE_EXT_LOG_MAX 8192)
CHUNK = 65_536
BATCH = 512
RETRY_MISSING_S = 0.5
RETRY_DENIED_S = 5.0

_log = get_logger("xid.kmsg")


@dataclass(frozen=True)
class Batch:
    records: list[KmsgRecord]
    live: bool
    arrival: float  # wall time when the batch was read
    # For a regular file: its identity (device:inode) and each record's end offset in it, which
    # identify a record across restarts even when several writers interleave sequence numbers.
    file_key: str | None = None
    ends: list[int] | None = None


Handler = Callable[[Batch], None]


class KmsgReader:
    def __init__(
        self,
        path: Path,
        handler: Handler,
        *,
        on_up: Callable[[bool], None],
        on_lost: Callable[[int], None],
        poll_interval: float = 0.05,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = path
        self._handler = handler
        self._on_up = on_up
        self._on_lost = on_lost
        self._poll = poll_interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._caught_up = False
        self._last_seq: int | None = None
        self._drains = 0
        self._drained = threading.Condition()
        self._limiter = RateLimiter(period=300.0)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="xid-kmsg", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Blocking: call off the event loop."""
        self._stop.set()
        with self._drained:
            self._drained.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_drained(self, timeout: float) -> bool:
        """Wait until the reader has read everything written before this call (or timeout).

        The NVML event thread calls this so that the kernel log, which names the process and the
        MIG instance, usually reports an Xid first. Two drains: the one in progress may have
        started before the caller's event was written.
        """
        deadline = time.monotonic() + timeout
        with self._drained:
            target = self._drains + 2
            while self._drains < target and not self._stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._drained.wait(remaining)
        return True

    # -- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                self._down(exc)
                continue
            try:
                self._on_up(True)
                mode = os.fstat(fd).st_mode
                if stat.S_ISCHR(mode):
                    self._follow_device(fd)
                else:
                    self._follow_stream(fd, regular=stat.S_ISREG(mode))
            except OSError as exc:
                self._down(exc)
            except Exception:  # a handler bug must not end Xid capture for good
                _log.exception("kernel log handler failed; reopening")
                self._on_up(False)
                self._stop.wait(1.0)
            finally:
                os.close(fd)
        self._on_up(False)

    def _down(self, exc: OSError) -> None:
        self._on_up(False)
        missing = isinstance(exc, FileNotFoundError)
        key = (type(exc).__name__, exc.errno)
        if self._limiter.allow(key) is not None:
            _log.warning(
                "kernel log unavailable; Xids come from NVML events only",
                path=str(self._path),
                error=exc.strerror or str(exc),
                hint="" if missing else "reading /dev/kmsg needs CAP_SYSLOG (dmesg_restrict)",
            )
        self._stop.wait(RETRY_MISSING_S if missing else RETRY_DENIED_S)

    def _follow_device(self, fd: int) -> None:
        while not self._stop.is_set():
            records: list[KmsgRecord] = []
            while len(records) < BATCH:
                try:
                    data = os.read(fd, MAX_RECORD)
                except BlockingIOError:
                    break
                except BrokenPipeError:
                    continue  # overwritten records: the next seq shows the gap
                except InterruptedError:
                    continue
                if not data:
                    break
                record = parse_record(data)
                if record is not None:
                    records.append(record)
            self._deliver(records, count_gaps=True)
            if len(records) < BATCH:
                self._mark_drained()
                select.select([fd], [], [], self._poll)

    def _follow_stream(self, fd: int, *, regular: bool) -> None:
        pending = b""
        position = 0  # bytes read so far; ``position - len(pending)`` starts the next line
        info = os.fstat(fd)
        file_key = f"{info.st_dev}:{info.st_ino}" if regular else None
        while not self._stop.is_set():
            try:
                data = os.read(fd, CHUNK)
            except BlockingIOError:
                data = b""
            except OSError as exc:
                if exc.errno != errno.EINTR:
                    raise
                continue
            if data:
                start = position - len(pending)
                position += len(data)
                lines = (pending + data).split(b"\n")
                pending = lines.pop()
                records, ends = [], []
                for line in lines:
                    start += len(line) + 1
                    record = parse_record(line)
                    if record is not None:
                        records.append(record)
                        ends.append(start)
                # Only a device or FIFO has one writer whose sequence gaps mean lost records.
                self._deliver(records, count_gaps=not regular, file_key=file_key, ends=ends)
                continue
            self._mark_drained()
            if regular and self._replaced(fd, position):
                _log.info(
                    "kernel log file was truncated or replaced; reopening", path=str(self._path)
                )
                return
            self._stop.wait(self._poll)

    def _replaced(self, fd: int, position: int) -> bool:
        try:
            on_disk = os.stat(self._path)
        except OSError:
            return False  # removed: keep reading the open file until it reappears
        return on_disk.st_ino != os.fstat(fd).st_ino or on_disk.st_size < position

    # -- hand-off ------------------------------------------------------------------------------

    def _deliver(
        self,
        records: list[KmsgRecord],
        *,
        count_gaps: bool,
        file_key: str | None = None,
        ends: list[int] | None = None,
    ) -> None:
        if not records:
            return
        if count_gaps:
            self._count_gaps(records)
        self._handler(Batch(records, self._caught_up, self._clock(), file_key, ends))

    def _count_gaps(self, records: list[KmsgRecord]) -> None:
        lost = 0
        for record in records:
            if record.seq is None:
                continue
            if self._last_seq is not None and record.seq > self._last_seq + 1:
                lost += record.seq - self._last_seq - 1
            self._last_seq = record.seq
        if lost:
            self._on_lost(lost)
            if self._limiter.allow("gap") is not None:
                _log.warning("kernel log records were lost (overwritten)", records=lost)

    def _mark_drained(self) -> None:
        self._caught_up = True
        with self._drained:
            self._drains += 1
            self._drained.notify_all()
