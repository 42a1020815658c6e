"""A kernel-log reader thread: ``/dev/kmsg`` itself, a FIFO, a regular file that is appended to, or
the ``syslog(2)`` system call (``klogctl``).

- The real device returns one record per ``read()``; it is opened non-blocking and waited on with
  ``select`` so a stop is seen within one poll interval. ``EPIPE`` (records overwritten while we
  read) is counted through the sequence-number gap of the next record.
- A regular file or FIFO is read in chunks and split into lines; a partial last line waits for
  its newline (up to :data:`MAX_RECORD` bytes: a longer line is dropped, see
  :class:`LineSplitter`). A regular file is followed like ``tail -F``: truncation or replacement
  reopens it, and the caller checks a saved offset against the file at each open.
- ``syslog(2)`` is the fallback for the default ``/dev/kmsg`` when opening it fails with EPERM,
  EACCES or ENOENT (a container runtime's device cgroup forbids the device, or it is not mounted),
  and the only mechanism for the path ``syslog:``. It reads the same ring buffer with CAP_SYSLOG
  alone: ``SYSLOG_ACTION_READ_ALL`` (non-destructive) is polled and each read is aligned on the
  previous one (:class:`SyslogBuffer`); only the lines after the overlap are new. There are no
  sequence numbers: each record carries a *mark* ``(usec, text hash, occurrence)`` instead.
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

from ..logs import RateLimitedLog, get_logger
from .lines import MAX_RECORD, LineSplitter
from .ops import KmsgMark
from .parser import KmsgRecord, parse_record
from .syslog import ReadAll, SyslogBuffer
from .wakeup import FileWatch, Poke

CHUNK = 65_536
BATCH = 512
RETRY_MISSING_S = 0.5
RETRY_DENIED_S = 5.0
DEVICE_PATH = Path("/dev/kmsg")
SYSLOG_PATH = Path("syslog:")  # --kmsg-path syslog: read through syslog(2) only
SYSLOG_POLL_S = 0.25
# A regular file watched with inotify is still checked this often (a change inotify cannot
# report, e.g. the file replaced on another mount), instead of every poll interval.
WATCHED_FILE_CHECK_S = 1.0
FALLBACK_ERRNOS = frozenset({errno.EPERM, errno.EACCES, errno.ENOENT})


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
    # syslog(2): each record's mark, in buffer order (the first, non-live batch is the whole
    # buffer, so a restart can find where it stopped).
    marks: list[KmsgMark] | None = None


Handler = Callable[[Batch], None]


@dataclass(frozen=True)
class KmsgSyscalls:
    """The calls that open and read the kernel log. Tests replace them to play ``/dev/kmsg``'s
    EPIPE: only the kernel's ring buffer can overwrite records under a reader."""

    open: Callable[[Path, int], int] = os.open
    read: Callable[[int, int], bytes] = os.read


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
        syslog: ReadAll | None = None,
        syslog_poll: float = SYSLOG_POLL_S,
        opener: Callable[[Path, int], int] = os.open,
        read: Callable[[int, int], bytes] = os.read,
        on_file: Callable[[str, int], None] | None = None,
        on_oversized: Callable[[], None] = lambda: None,
    ) -> None:
        """``syslog`` reads the whole kernel log (``syslog.Klogctl``); given, it is used for
        the path ``syslog:``, and when the path is ``/dev/kmsg`` and cannot be opened.
        ``opener`` and ``read`` are the system calls (see :class:`KmsgSyscalls`). ``on_file`` is
        called with a regular file's key and descriptor each time it is opened, before it is
        read (the caller checks its saved offset is still good); ``on_oversized`` once for each
        line dropped as longer than :data:`MAX_RECORD`."""
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
        self._rlog = RateLimitedLog(_log, period=300.0)
        self._syslog_only = path == SYSLOG_PATH
        self._syslog = syslog if self._syslog_only or path == DEVICE_PATH else None
        self._syslog_poll = syslog_poll
        self._opener = opener
        self._read_fd = read
        self._on_file = on_file
        self._on_oversized = on_oversized
        self._wake = threading.Event()  # a syslog(2) poll now (stop, or a drain asked for)
        self._poke = Poke()  # the same for a file or FIFO waited on in select
        self.mechanism: str | None = None  # "device", "fifo", "file" or "syslog" once read

    @property
    def syslog_fallback(self) -> bool:
        return self._syslog is not None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="xid-kmsg", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Blocking: call off the event loop."""
        self._stop.set()
        self._wake.set()
        self._poke.poke()
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
                self._wake.set()  # syslog(2) is polled: read now rather than at the next poll
                self._poke.poke()  # so is a FIFO; a watched file waits for a change
                self._drained.wait(remaining)
        return True

    # -- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._read()
            except OSError as exc:
                self._down(exc)
            except Exception:  # a handler bug must not end Xid capture for good
                _log.exception("kernel log handler failed; reopening")
                self._on_up(False)
                self._stop.wait(1.0)
        self._on_up(False)

    def _read(self) -> None:
        """Open the kernel log (or fall back to syslog(2)) and follow it until stop or error."""
        # Every (re)open starts with the ring buffer's history: it is replay until the end is
        # reached again, so the journal, not "live", decides what was counted before.
        self._caught_up = False
        if self._syslog_only:
            assert self._syslog is not None
            self._follow_syslog(self._syslog, None)
            return
        try:
            fd = self._opener(self._path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if self._syslog is None or exc.errno not in FALLBACK_ERRNOS:
                raise
            self._follow_syslog(self._syslog, exc)
            return
        try:
            mode = os.fstat(fd).st_mode
            device = stat.S_ISCHR(mode)
            self._opened("device" if device else "file" if stat.S_ISREG(mode) else "fifo")
            if device:
                self._follow_device(fd)
            else:
                self._follow_stream(fd, regular=stat.S_ISREG(mode))
        finally:
            os.close(fd)

    def _waiter(self, fd: int, regular: bool) -> tuple[list[int], float, FileWatch | None]:
        """What ``select`` waits on between reads of a file or FIFO, and for how long at most."""
        poke = self._poke.open()
        if self._stop.is_set():
            self._poke.poke()  # stop() came before the pipe existed
        watch = FileWatch.open(fd) if regular else None
        if watch is None:
            return [poke], self._poll, None
        return [poke, watch.fd], max(self._poll, WATCHED_FILE_CHECK_S), watch

    def _opened(self, mechanism: str, why: OSError | None = None) -> None:
        self._on_up(True)
        if mechanism == self.mechanism:
            return
        self.mechanism = mechanism
        if mechanism == "syslog":
            _log.info(
                "kernel log read through syslog(2)",
                mechanism=mechanism,
                path=str(self._path),
                why=None if why is None else f"{self._path}: {why.strerror or why}",
            )
        else:
            _log.info("kernel log opened", mechanism=mechanism, path=str(self._path))

    def _down(self, exc: OSError) -> None:
        self._on_up(False)
        missing = isinstance(exc, FileNotFoundError)
        key = (type(exc).__name__, exc.errno)
        self._rlog.warning(
            key,
            "kernel log unavailable; Xids come from NVML events only",
            path=str(self._path),
            error=exc.strerror or str(exc),
            hint=self._hint(missing),
        )
        self._stop.wait(RETRY_MISSING_S if missing else RETRY_DENIED_S)

    def _hint(self, missing: bool) -> str:
        if self._syslog is not None:
            return "syslog(2) needs CAP_SYSLOG (and a seccomp profile that allows syslog)"
        return "" if missing else "reading /dev/kmsg needs CAP_SYSLOG (dmesg_restrict)"

    def _follow_syslog(self, read_all: ReadAll, why: OSError | None) -> None:
        """Poll syslog(2) READ_ALL; what the first read returns is replay, the rest is live."""
        buffer = SyslogBuffer()
        try:
            data = read_all()  # EPERM without CAP_SYSLOG, or where seccomp forbids it
        except OSError as exc:
            if why is None:
                raise
            raise OSError(
                exc.errno, f"{why.strerror or why}; syslog(2): {exc.strerror or exc}"
            ) from exc
        self._opened("syslog", why)
        live = False  # each (re)start's first read is replay: the journal's mark says what is new
        while True:
            records, marks, lost = buffer.update(data)
            if lost:
                self._rlog.warning(
                    "syslog-lost",
                    "kernel log moved past everything last read (cleared, or overwritten "
                    "between two polls): records may have been lost",
                    poll_s=self._syslog_poll,
                )
            if records:
                self._handler(Batch(records, live, self._clock(), marks=marks))
            live = True
            self._mark_drained()
            self._wake.wait(self._syslog_poll)
            self._wake.clear()
            if self._stop.is_set():
                return
            data = read_all()

    def _follow_device(self, fd: int) -> None:
        while not self._stop.is_set():
            records: list[KmsgRecord] = []
            while len(records) < BATCH:
                try:
                    data = self._read_fd(fd, MAX_RECORD)
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
        waits, timeout, watch = self._waiter(fd, regular)
        try:
            self._follow_lines(fd, regular, waits, timeout)
        finally:
            self._poke.close()
            if watch is not None:
                watch.close()

    def _follow_lines(self, fd: int, regular: bool, waits: list[int], timeout: float) -> None:
        lines = LineSplitter(self._oversized)
        info = os.fstat(fd)
        file_key = f"{info.st_dev}:{info.st_ino}" if regular else None
        if file_key is not None and self._on_file is not None:
            self._on_file(file_key, fd)  # may reset the saved offset: truncated or rewritten
        sized: bool | None = None  # a file whose size says how far it goes (not /proc/version)
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
                if regular and sized is None:
                    # A pseudo-file (procfs, sysfs) reports size 0 whatever it holds.
                    sized = os.fstat(fd).st_size >= lines.position + len(data)
                records, ends = [], []
                for line, end in lines.feed(data):
                    record = parse_record(line)
                    if record is not None:
                        records.append(record)
                        ends.append(end)
                # Only a device or FIFO has one writer whose sequence gaps mean lost records.
                self._deliver(records, count_gaps=not regular, file_key=file_key, ends=ends)
                continue
            self._mark_drained()
            if regular and self._replaced(fd, lines.position, sized is not False):
                self._rlog.info(
                    "replaced",
                    "kernel log file was truncated or replaced; reopening",
                    path=str(self._path),
                )
                return
            ready, _, _ = select.select(waits, [], [], timeout)
            for ready_fd in ready:
                Poke.clear(ready_fd)  # a poke, or inotify's queued events: read them all

    def _oversized(self, length: int) -> None:
        self._on_oversized()
        self._rlog.warning(
            "oversized",
            "kernel log line longer than the kernel's longest record dropped",
            path=str(self._path),
            max_bytes=MAX_RECORD,
            bytes_at_least=length,
        )

    def _replaced(self, fd: int, position: int, sized: bool) -> bool:
        try:
            on_disk = os.stat(self._path)
        except OSError:
            return False  # removed: keep reading the open file until it reappears
        if on_disk.st_ino != os.fstat(fd).st_ino:
            return True
        return sized and on_disk.st_size < position

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
            self._rlog.warning("gap", "kernel log records were lost (overwritten)", records=lost)

    def _mark_drained(self) -> None:
        self._caught_up = True
        with self._drained:
            self._drains += 1
            self._drained.notify_all()
