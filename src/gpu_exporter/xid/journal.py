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

Before and after each append, and at each :meth:`Journal.repair`, the op log being appended to
is checked to still be the file at the journal's path (:mod:`.statedir`): a directory removed,
renamed away, replaced by another or by a symlink would otherwise take the writes into a file no
restart reads. Then ``ok`` is False until a real directory is at the path again, and the next
snapshot goes there.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ..logs import RateLimitedLog, get_logger
from .ops import BadOp, Numbered, Op, encode
from .state import XidState
from .statedir import (
    READ_FLAGS,
    StateDir,
    TooLarge,
    Unusable,
    Write,
    check_state_dir,
    read_nofollow,
    write_all,
)
from .validate import check_op, check_snapshot

SNAPSHOT_NAME = "xid-state.json"
LOG_NAME = "xid-journal.jsonl"
COMPACT_AFTER_OPS = 10_000
MAX_OP_BYTES = 65_536  # one op line (they are under 1 KiB); longer is damage, skipped unread
MAX_SNAPSHOT_BYTES = 64 * 2**20  # the snapshot of a bounded state is a few MiB at most

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
        self._files = StateDir(state_dir, write) if state_dir is not None else None
        self._fd: int | None = None
        self._ops_in_log = 0
        self._next_number = 1
        self._load_ok = True
        self._write_ok = state_dir is not None
        self._needs_snapshot = True
        self._rlog = RateLimitedLog(_log, period=60.0, clock=clock)
        self._refused = False  # the state directory failed check_state_dir: never touched
        self._log_damaged = False
        self._lost: str | None = None  # why the directory in use is no longer at the path
        self.errors: Counter[str] = Counter()  # by operation: load, append, snapshot

    @property
    def ok(self) -> bool:
        """The files hold the whole state: it loaded cleanly (or has been rewritten since) and
        the last write succeeded."""
        return self._load_ok and self._write_ok

    @property
    def needs_repair(self) -> bool:
        return self._dir is not None and not self._refused and not self.ok

    def repair(self, snapshot: Callable[[], dict[str, Any]]) -> bool:
        """Rewrite the whole state if the files are behind, damaged, or no longer at the path
        (see :meth:`check`); True when ``ok`` became True."""
        self.check()
        if not self.needs_repair:
            return False
        self.compact(snapshot())
        return self.ok

    # -- loading -----------------------------------------------------------------------------

    def load(self) -> XidState:
        """Rebuild the state from disk (an empty state when there is none or it is corrupt).

        Streamed, with every line at most :data:`MAX_OP_BYTES` and every field checked
        (:mod:`.validate`): what fails is counted and left out, and the damaged file is set aside
        (renamed ``*.corrupt-<time>``) before the whole state is written again."""
        if self._dir is None:
            _log.warning("no --state-dir: Xid counts and drain latches will not survive a restart")
            return XidState()
        refused = check_state_dir(self._dir)
        if refused is not None:
            self._refuse(refused)
            return XidState()
        state = self._load_snapshot()
        damaged = False
        for number, op in self._load_ops():
            try:
                check_op(op)
                if op.get("n", 0) <= state.op_number:
                    continue  # already in the snapshot (crash between snapshot and truncation)
                state.apply(op)
            except BadOp as exc:
                self._corrupt(LOG_NAME, f"line {number}: {exc}")
                damaged = True
        if damaged or self._log_damaged:
            self._set_aside(self._dir / LOG_NAME)
        self._next_number = state.op_number + 1
        return state

    def _refuse(self, why: str) -> None:
        """The state directory is not safe to use: neither read nor written (until a restart)."""
        self._refused = True
        self._load_ok = self._write_ok = False
        self.errors["load"] += 1
        _log.error(
            "state directory refused; Xid counts and drain latches are kept in memory only",
            state_dir=str(self._dir),
            why=why,
        )

    def _load_snapshot(self) -> XidState:
        assert self._dir is not None
        path = self._dir / SNAPSHOT_NAME
        try:
            data = json.loads(read_nofollow(path, MAX_SNAPSHOT_BYTES))
        except FileNotFoundError:
            if not (self._dir / LOG_NAME).exists():
                _log.info("no Xid journal yet; starting from zero", state_dir=str(self._dir))
            return XidState()
        except TooLarge as exc:
            self._corrupt(SNAPSHOT_NAME, str(exc))
            self._set_aside(path)
            return XidState()
        except OSError as exc:  # ELOOP: a symlink planted in its place
            self._corrupt(SNAPSHOT_NAME, f"unreadable: {exc.strerror or exc}")
            return XidState()
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON
            self._corrupt(SNAPSHOT_NAME, f"not JSON: {str(exc)[:200]}")
            self._set_aside(path)
            return XidState()
        try:
            kept, problems = check_snapshot(data)
            state = XidState.from_snapshot(kept)
        except BadOp as exc:
            self._corrupt(SNAPSHOT_NAME, str(exc))
            self._set_aside(path)
            return XidState()
        if problems:
            reason = f"{len(problems)} entries left out; {problems[0]}"
            self._corrupt(SNAPSHOT_NAME, reason, count=len(problems))
            self._set_aside(path)
        return state

    def _load_ops(self) -> Iterator[tuple[int, Any]]:
        """Each op line, parsed, with its line number (streamed: never the whole file)."""
        assert self._dir is not None
        self._log_damaged = False
        try:
            fd = os.open(self._dir / LOG_NAME, READ_FLAGS)
        except FileNotFoundError:
            return
        except OSError as exc:
            self._corrupt(LOG_NAME, f"unreadable: {exc.strerror or exc}")
            return
        with os.fdopen(fd, "rb") as file:
            for number, line in journal_lines(file, MAX_OP_BYTES):
                if line is None:
                    self._corrupt(LOG_NAME, f"line {number} is longer than {MAX_OP_BYTES} bytes")
                    self._log_damaged = True
                    continue
                if not line.strip():
                    continue
                try:
                    yield number, json.loads(line)
                except (ValueError, RecursionError):
                    self._corrupt(LOG_NAME, f"line {number} is not JSON")
                    self._log_damaged = True

    def _corrupt(self, name: str, reason: str, count: int = 1) -> None:
        """``count`` entries of ``name`` could not be used (each counted)."""
        self._load_ok = False
        self.errors["load"] += count
        self._rlog.warning(
            ("load", name),
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
        if self._dir is None or self._refused or not ops:
            return
        if self._needs_snapshot or self._ops_in_log + len(ops) > COMPACT_AFTER_OPS:
            self.compact(snapshot())
            return
        lines = (json.dumps(encode(n.op, n.number), separators=(",", ":")) for n in ops)
        payload = "".join(line + "\n" for line in lines).encode()
        if self._moved(snapshot):
            return  # folded into a snapshot (or kept in memory until the directory is back)
        try:
            fd = self._log_fd()
            write_all(self._write, fd, payload)
            os.fsync(fd)
        except OSError as exc:
            self._write_failed("append", exc)
            return
        # Checked again once durable: removed in between, the lines went to a file no one reads.
        if self._moved(snapshot):
            return
        self._ops_in_log += len(ops)
        self._write_ok = True

    def compact(self, snapshot: dict[str, Any]) -> None:
        """Write ``snapshot`` atomically, then empty the op log."""
        if self._files is None or self._refused:
            return
        try:
            self._files.replace(SNAPSHOT_NAME, json.dumps(snapshot).encode())
            self._close_fd()
            # Emptied by replacing it (a link planted in its place is replaced, never followed).
            self._files.replace(LOG_NAME, b"")
            self._fd = self._files.open_append(LOG_NAME)
        except Unusable as exc:  # the directory in use went, and is not back
            self._lose(str(exc))
            return
        except OSError as exc:
            self._write_failed("snapshot", exc)
            return
        self._lost = None
        self._ops_in_log = 0
        self._needs_snapshot = False
        self._write_ok = True
        self._load_ok = True  # whatever was damaged on disk is replaced by the whole state

    def check(self) -> bool:
        """Whether the files being written are still the journal's at its path (a directory
        removed or replaced makes ``ok`` False; :meth:`repair` then writes where it is back)."""
        if self.ok and self._fd is not None and (why := self._moved_away()) is not None:
            self._lose(why)
        return self.ok

    def close(self) -> None:
        self._close_fd()
        if self._files is not None:
            self._files.close()

    def _log_fd(self) -> int:
        if self._fd is None:
            assert self._files is not None
            self._fd = self._files.open_append(LOG_NAME)
        return self._fd

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _moved(self, snapshot: Callable[[], dict[str, Any]]) -> bool:
        """True when the op log is no longer the journal's (then the whole state is written
        where the directory is now, or kept in memory until it is back)."""
        why = self._moved_away()
        if why is None:
            return False
        self._lose(why)
        self.compact(snapshot())
        return True

    def _moved_away(self) -> str | None:
        """Why the op log open for appending is not the file at the journal's path, or None."""
        if self._fd is None or self._files is None:
            return None
        return self._files.file_moved(LOG_NAME, self._fd)

    def _lose(self, why: str) -> None:
        """The directory in use went (or its op log did): counted once, warned once a minute,
        the state kept in memory until a snapshot is written at the path again."""
        if self._lost is None:
            self.errors["append"] += 1
        self._lost = why
        self._write_ok = False
        self._needs_snapshot = True
        self._close_fd()
        self._rlog.warning(
            "lost",
            "the Xid state directory is gone, replaced or unsafe; counts are kept in memory "
            "and written there once it is usable again",
            state_dir=str(self._dir),
            why=why,
        )

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


def journal_lines(file: BinaryIO, limit: int) -> Iterator[tuple[int, bytes | None]]:
    """Each complete line of ``file`` with its number, or None for a line longer than ``limit``
    (skipped without being held). A short last line without its newline (a write cut short by a
    crash) is left out with a warning."""
    number = 0
    while line := file.readline(limit + 1):
        number += 1
        if line.endswith(b"\n"):
            yield number, line
            continue
        if len(line) <= limit:
            _log.warning("ignoring a partly written last journal line", bytes=len(line))
            return
        while (rest := file.readline(65_536)) and not rest.endswith(b"\n"):
            pass
        yield number, None
