"""A kernel-log reader thread: ``/dev/kmsg`` itself, a FIFO, a regular file that is appended to, or
the ``syslog(2)`` system call (``klogctl``).

- The real device returns one record per ``read()``; it is opened non-blocking and waited on with
  ``select`` so a stop is seen within one poll interval. ``EPIPE`` (records overwritten while we
  read) is counted through the sequence-number gap of the next record.
- A regular file or FIFO is read in chunks and split into lines; a partial last line waits for
  its newline. A regular file is followed like ``tail -F``: truncation or replacement reopens it.
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

import ctypes
import errno
import os
import select
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..logs import RateLimiter, get_logger
from .parser import KmsgRecord, parse_record, parse_syslog, text_hash

MAX_RECORD = 16_384  # larger than the kernel's longest record (CONSOLE_EXT_LOG_MAX 8192)
CHUNK = 65_536
BATCH = 512
RETRY_MISSING_S = 0.5
RETRY_DENIED_S = 5.0
DEVICE_PATH = Path("/dev/kmsg")
SYSLOG_PATH = Path("syslog:")  # --kmsg-path syslog: read through syslog(2) only
SYSLOG_POLL_S = 0.25
FALLBACK_ERRNOS = frozenset({errno.EPERM, errno.EACCES, errno.ENOENT})
SYSLOG_ACTION_READ_ALL = 3
SYSLOG_ACTION_SIZE_BUFFER = 10
MAX_OVERLAP_CANDIDATES = 64

# A record's identity without a sequence number: (printk usec or None, text hash, occurrence
# index among the identical lines in the buffer read). Unique in a boot up to the limits in
# docs/xid.md ("Restarts").
Mark = tuple[int | None, str, int]
ReadAll = Callable[[], bytes]

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
    marks: list[Mark] | None = None


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
    ) -> None:
        """``syslog`` reads the whole kernel log (see :class:`Klogctl`); given, it is used for
        the path ``syslog:``, and when the path is ``/dev/kmsg`` and cannot be opened.
        ``opener`` and ``read`` are the system calls (see :class:`KmsgSyscalls`)."""
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
        self._syslog_only = path == SYSLOG_PATH
        self._syslog = syslog if self._syslog_only or path == DEVICE_PATH else None
        self._syslog_poll = syslog_poll
        self._opener = opener
        self._read_fd = read
        self._wake = threading.Event()  # a syslog(2) poll now (stop, or a drain asked for)
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
        if self._limiter.allow(key) is not None:
            _log.warning(
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
            if lost and self._limiter.allow("syslog-lost") is not None:
                _log.warning(
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


class SyslogBuffer:
    """Turns successive whole-buffer reads of the kernel log (syslog(2) READ_ALL) into new records.

    The ring buffer only ever drops its oldest lines and appends new ones, so each read is the
    previous one less a prefix plus new lines: the new lines are what follows the longest suffix
    of the previous read that the new read starts with. Counting the overlap as large as possible
    errs towards "already seen": a record is never handed over twice. When nothing of the previous
    read is left (the buffer was cleared, or rotated entirely between two reads) every line is new
    and ``lost`` is reported.

    Each record's mark is ``(usec, text hash, occurrence)``, the occurrence being how many
    identical lines precede it in the buffer (0 unless the same text was logged twice in one
    microsecond, or there are no timestamps).
    """

    def __init__(self) -> None:
        self._previous = b""
        self._counts: Counter[bytes] = Counter()

    def update(self, data: bytes) -> tuple[list[KmsgRecord], list[Mark], bool]:
        previous = self._previous
        dropped, start = overlap(previous, data)
        lost = bool(previous) and start == 0 and bool(data)
        if dropped:
            counts = self._counts
            for line in previous[:dropped].split(b"\n"):
                left = counts[line] - 1
                if left > 0:
                    counts[line] = left
                else:
                    counts.pop(line, None)
        self._previous = data
        records: list[KmsgRecord] = []
        marks: list[Mark] = []
        if start >= len(data):
            return records, marks, False
        new = data[start:]
        here: Counter[bytes] = Counter()  # identical lines earlier in this same read
        for record, first in parse_syslog(new):
            records.append(record)
            occurrence = self._counts[first] + here[first]
            here[first] += 1
            marks.append((record.usec, text_hash(record.message), occurrence))
        self._counts.update(new.split(b"\n"))
        return records, marks, lost


def overlap(previous: bytes, data: bytes) -> tuple[int, int]:
    """``(dropped, start)``: ``previous[dropped:] == data[:start]``, the longest such overlap that
    starts at a line boundary; ``(len(previous), 0)`` when none does."""
    if not previous:
        return 0, 0
    if data.startswith(previous):
        return 0, len(previous)
    end = data.find(b"\n")
    if end < 0:
        return len(previous), 0
    first = data[: end + 1]
    candidate = previous.find(first, 1)
    tries = 0
    while candidate >= 0:
        if previous[candidate - 1] == 0x0A and data.startswith(previous[candidate:]):
            return candidate, len(previous) - candidate
        tries += 1
        if tries >= MAX_OVERLAP_CANDIDATES:
            return _overlap_by_lines(previous, data)
        candidate = previous.find(first, candidate + 1)
    return len(previous), 0


def _overlap_by_lines(previous: bytes, data: bytes) -> tuple[int, int]:
    """:func:`overlap` in linear time (prefix function over lines), for a buffer of many identical
    lines (no timestamps) where trying each candidate would be quadratic."""
    old = previous.split(b"\n")[:-1]
    new = data.split(b"\n")[:-1]
    # Longest prefix of ``new`` that is a suffix of ``old``: KMP over new + [sentinel] + old.
    sequence: list[bytes | None] = [*new, None, *old]
    border = [0] * len(sequence)
    for i in range(1, len(sequence)):
        k = border[i - 1]
        while k and sequence[i] != sequence[k]:
            k = border[k - 1]
        if sequence[i] == sequence[k] and sequence[i] is not None:
            k += 1
        border[i] = k
    lines = border[-1]
    if not lines:
        return len(previous), 0
    start = sum(len(line) + 1 for line in new[:lines])
    return len(previous) - start, start


class Klogctl:
    """``syslog(2)`` through glibc's ``klogctl``: the whole kernel log, non-destructively.

    The buffer is sized on the first call (``SYSLOG_ACTION_SIZE_BUFFER``), twice the ring buffer
    because the text adds a prefix to each line. Raises :class:`OSError` (EPERM without
    CAP_SYSLOG under ``kernel.dmesg_restrict=1``, or where seccomp forbids the call).
    """

    def __init__(self) -> None:
        self._call: Callable[[int, ctypes.Array[ctypes.c_char] | None, int], int] | None = None
        self._buffer: ctypes.Array[ctypes.c_char] | None = None

    def __call__(self) -> bytes:
        call = self._call
        if call is None:
            libc = ctypes.CDLL(None, use_errno=True)
            function = libc.klogctl
            function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
            function.restype = ctypes.c_int
            call = self._call = function
        if self._buffer is None:
            size = call(SYSLOG_ACTION_SIZE_BUFFER, None, 0)
            if size < 0:
                raise _errno_error("syslog(SYSLOG_ACTION_SIZE_BUFFER)")
            self._buffer = ctypes.create_string_buffer(max(2 * size, 4096))
        buffer = self._buffer
        length = call(SYSLOG_ACTION_READ_ALL, buffer, len(buffer))
        if length < 0:
            raise _errno_error("syslog(SYSLOG_ACTION_READ_ALL)")
        return buffer.raw[:length]


def _errno_error(what: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"{os.strerror(number)} ({what})")
