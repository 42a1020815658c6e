"""Lines of a kernel-log file or FIFO: split with a cap on their length, and a saved offset in a
regular file checked against what the file holds now (see docs/xid.md, "Restarts")."""

from __future__ import annotations

import os
from collections.abc import Callable

from .parser import parse_record, text_hash

MAX_RECORD = 16_384  # larger than the kernel's longest record (CONSOLE_EXT_LOG_MAX 8192)


def offset_problem(fd: int, offset: int, digest: str | None) -> str | None:
    """Why a regular file no longer holds, ending at ``offset``, the record whose text hash is
    ``digest`` (None: it does, as far as can be told). A file truncated (copytruncate) or
    rewritten in place since the offset was saved must not have its new records below the offset
    taken as read."""
    size = os.fstat(fd).st_size
    if size < offset:
        return f"the file ({size} bytes) is shorter than the saved offset ({offset})"
    length = min(offset, MAX_RECORD + 1)
    tail = os.pread(fd, length, offset - length)
    if not tail.endswith(b"\n"):
        return "no record ends at the saved offset"
    if digest is None:
        return None  # saved by an exporter that kept no hash: the offset is all there is
    record = parse_record(tail[:-1].rsplit(b"\n", 1)[-1])
    if record is None or text_hash(record.message) != digest:
        return "the record at the saved offset is not the one read"
    return None


class LineSplitter:
    """Splits a byte stream into lines, each with its end offset in the stream (past its newline).

    A line longer than ``limit`` (the kernel's records are far shorter: only a broken or hostile
    writer makes one) is dropped as it arrives, not joined: ``oversized`` is called once for it
    with the length seen so far, and everything up to its newline is skipped. Memory stays under
    ``limit`` plus one chunk and the cost is linear in the bytes read.
    """

    def __init__(self, oversized: Callable[[int], None], limit: int = MAX_RECORD) -> None:
        self._oversized = oversized
        self._limit = limit
        self._pending = b""
        self._skipping = False
        self.position = 0  # bytes fed so far

    def feed(self, data: bytes) -> list[tuple[bytes, int]]:
        start = self.position
        self.position += len(data)
        if self._skipping:
            newline = data.find(b"\n")
            if newline < 0:
                return []
            self._skipping = False
            data = data[newline + 1 :]
            start += newline + 1
        start -= len(self._pending)
        parts = (self._pending + data).split(b"\n") if self._pending else data.split(b"\n")
        self._pending = parts.pop()
        out = []
        for line in parts:
            start += len(line) + 1
            if len(line) > self._limit:
                self._oversized(len(line))
                continue
            out.append((line, start))
        if len(self._pending) > self._limit:
            self._oversized(len(self._pending))
            self._pending = b""
            self._skipping = True
        return out
