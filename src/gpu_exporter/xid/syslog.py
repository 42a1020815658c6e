"""The ``syslog(2)`` side of the kernel-log reader: the ``klogctl`` call, and successive
whole-buffer reads turned into new records (see :class:`SyslogBuffer` and docs/xid.md)."""

from __future__ import annotations

import ctypes
import os
from collections import Counter
from collections.abc import Callable

from .ops import KmsgMark
from .parser import KmsgRecord, parse_syslog, text_hash

SYSLOG_ACTION_READ_ALL = 3
SYSLOG_ACTION_SIZE_BUFFER = 10
MAX_OVERLAP_CANDIDATES = 64

# A record's identity without a sequence number: (printk usec or None, text hash, occurrence
# index among the identical lines in the buffer read). Unique in a boot up to the limits in
# docs/xid.md ("Restarts").
ReadAll = Callable[[], bytes]


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

    def update(self, data: bytes) -> tuple[list[KmsgRecord], list[KmsgMark], bool]:
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
        marks: list[KmsgMark] = []
        if start >= len(data):
            return records, marks, False
        new = data[start:]
        here: Counter[bytes] = Counter()  # identical lines earlier in this same read
        for record, first in parse_syslog(new):
            records.append(record)
            occurrence = self._counts[first] + here[first]
            here[first] += 1
            marks.append(KmsgMark(record.usec, text_hash(record.message), occurrence))
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
