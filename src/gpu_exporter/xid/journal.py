"""The on-disk Xid journal: a snapshot (atomically replaced) plus an append-only op log.

- ``xid-state.json``: the whole state, written to a temporary file, fsynced, then renamed over
  the old one (and the directory fsynced), so it is always either the old or the new snapshot.
- ``xid-journal.jsonl``: one op per line, appended and fsynced before the op's effect can be
  lost. Each op is numbered; the snapshot records the last number it includes, so a crash between
  writing a snapshot and truncating the log never applies an op twice.

A missing, unreadable, unwritable, full or corrupt journal never stops the exporter: it warns,
keeps the state in memory, sets ``ok`` to False (``gpu_exporter_state_journal_ok``), counts the
failure in ``errors`` and writes a full snapshot on the next change or the caller's next
:meth:`Journal.repair`, whichever comes first. Once a snapshot is written, the files hold the whole
state again and ``ok`` is True.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..logs import RateLimitedLog, get_logger
from .ops import BadOp, Numbered, Op, encode
from .state import XidState

SNAPSHOT_NAME = "xid-state.json"
LOG_NAME = "xid-journal.jsonl"
COMPACT_AFTER_OPS = 10_000
_APPEND_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC

# ``os.write``'s shape. Tests pass one that fails like a full or read-only disk would: neither
# can be made on demand without privileges, and an open descriptor ignores later permission
# changes, so the write call is where those faults really arrive.
Write = Callable[[int, memoryview], int]

_log = get_logger("xid.journal")


class Journal:
    """Not thread-safe: the caller (the Xid core) serialises access with its lock."""

    def __init__(
        self,
        state_dir: Path | None,
        clock: Callable[[], float] = time.monotonic,
        write: Write = os.write,
    ):
        self._dir = state_dir
        self._write = write
        self._fd: int | None = None
        self._ops_in_log = 0
        self._next_number = 1
        self._load_ok = True
        self._write_ok = state_dir is not None
        self._needs_snapshot = True
        self._rlog = RateLimitedLog(_log, period=60.0, clock=clock)
        self.errors: Counter[str] = Counter()  # by operation: load, append, snapshot

    @property
    def ok(self) -> bool:
        """The files hold the whole state: it loaded cleanly (or has been rewritten since) and
        the last write succeeded."""
        return self._load_ok and self._write_ok

    @property
    def needs_repair(self) -> bool:
        return self._dir is not None and not self.ok

    def repair(self, snapshot: dict[str, Any]) -> bool:
        """Rewrite the whole state if the files are behind or damaged; True when ``ok`` changed."""
        if not self.needs_repair:
            return False
        self.compact(snapshot)
        return self.ok

    # -- loading -----------------------------------------------------------------------------

    def load(self) -> XidState:
        """Rebuild the state from disk (an empty state when there is none or it is corrupt)."""
        if self._dir is None:
            _log.warning("no --state-dir: Xid counts and drain latches will not survive a restart")
            return XidState()
        state = self._load_snapshot()
        for op in self._load_ops():
            if op.get("n", 0) <= state.op_number:
                continue  # already in the snapshot (crash between snapshot and truncation)
            try:
                state.apply(op)
            except BadOp as exc:
                self._corrupt(LOG_NAME, str(exc))
        self._next_number = state.op_number + 1
        return state

    def _load_snapshot(self) -> XidState:
        assert self._dir is not None
        path = self._dir / SNAPSHOT_NAME
        try:
            text = path.read_text("utf-8")
        except FileNotFoundError:
            if not (self._dir / LOG_NAME).exists():
                _log.info("no Xid journal yet; starting from zero", state_dir=str(self._dir))
            return XidState()
        except (OSError, UnicodeDecodeError) as exc:
            self._corrupt(SNAPSHOT_NAME, f"unreadable: {exc}")
            return XidState()
        try:
            return XidState.from_snapshot(json.loads(text))
        except (ValueError, BadOp) as exc:
            self._corrupt(SNAPSHOT_NAME, str(exc))
            self._set_aside(path)
            return XidState()

    def _load_ops(self) -> list[dict[str, Any]]:
        assert self._dir is not None
        try:
            data = (self._dir / LOG_NAME).read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            self._corrupt(LOG_NAME, f"unreadable: {exc}")
            return []
        lines = data.split(b"\n")
        torn = lines.pop()  # after the last newline: empty, or a write cut short by a crash
        if torn:
            _log.warning("ignoring a partly written last journal line", bytes=len(torn))
        ops: list[dict[str, Any]] = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                op = json.loads(line)
            except ValueError:
                op = None
            if not isinstance(op, dict):
                self._corrupt(LOG_NAME, f"line {number} is not a JSON object")
                continue
            ops.append(op)
        return ops

    def _corrupt(self, name: str, reason: str) -> None:
        self._load_ok = False
        self.errors["load"] += 1
        _log.warning(
            "Xid journal is corrupt; continuing with what could be read",
            file=str(self._dir / name) if self._dir else name,
            reason=reason,
        )

    def _set_aside(self, path: Path) -> None:
        with contextlib.suppress(OSError):  # the next snapshot overwrites it anyway
            os.replace(path, path.with_name(f"{path.name}.corrupt-{int(time.time())}"))

    # -- writing -----------------------------------------------------------------------------

    def number(self, ops: Iterable[Op]) -> list[Numbered]:
        """Give each op its journal number (before it is applied, so replay skips it once)."""
        numbered = []
        for op in ops:
            numbered.append(Numbered(self._next_number, op))
            self._next_number += 1
        return numbered

    def append(self, ops: list[Numbered], snapshot: Callable[[], dict[str, Any]]) -> None:
        """Make ``ops`` durable: appended and fsynced, or folded into a fresh snapshot."""
        if self._dir is None or not ops:
            return
        if self._needs_snapshot or self._ops_in_log + len(ops) > COMPACT_AFTER_OPS:
            self.compact(snapshot())
            return
        lines = (json.dumps(encode(n.op, n.number), separators=(",", ":")) for n in ops)
        payload = "".join(line + "\n" for line in lines).encode()
        try:
            fd = self._log_fd()
            _write_all(self._write, fd, payload)
            os.fsync(fd)
        except OSError as exc:
            self._write_failed("append", exc)
            return
        self._ops_in_log += len(ops)
        self._write_ok = True

    def compact(self, snapshot: dict[str, Any]) -> None:
        """Write ``snapshot`` atomically, then empty the op log."""
        if self._dir is None:
            return
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            _atomic_write(self._write, self._dir / SNAPSHOT_NAME, json.dumps(snapshot).encode())
            self._close_fd()
            fd = os.open(self._dir / LOG_NAME, _APPEND_FLAGS | os.O_TRUNC, 0o600)
            os.fsync(fd)
            self._fd = fd
        except OSError as exc:
            self._write_failed("snapshot", exc)
            return
        self._ops_in_log = 0
        self._needs_snapshot = False
        self._write_ok = True
        self._load_ok = True  # whatever was damaged on disk is replaced by the whole state

    def close(self) -> None:
        self._close_fd()

    def _log_fd(self) -> int:
        if self._fd is None:
            assert self._dir is not None
            self._fd = os.open(self._dir / LOG_NAME, _APPEND_FLAGS, 0o600)
        return self._fd

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _write_failed(self, what: str, exc: OSError) -> None:
        self._write_ok = False
        self.errors[what] += 1
        self._needs_snapshot = True  # a lost append must not leave a gap in the log
        self._close_fd()
        self._rlog.warning(
            what,
            "cannot write the Xid journal; counts are kept in memory only",
            state_dir=str(self._dir),
            operation=what,
            error=exc.strerror or str(exc),
        )


def _write_all(write: Write, fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = write(fd, view)
        view = view[written:]


def _atomic_write(write: Write, path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(write, fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
