"""The state directory, trusted no further than it must be (the exporter runs as root, and the
directory is a host path others may reach).

- Never through a symlink: the directory is opened with ``O_NOFOLLOW | O_DIRECTORY`` and every
  file in it is reached through that descriptor with ``O_NOFOLLOW``; a file is replaced by
  creating a temporary one exclusively and renaming it over, so a link planted at any name is
  replaced, never followed (it would have the exporter truncate and overwrite any file).
- Still what the path names: a directory removed, renamed away or replaced (by another
  directory or a symlink) while open would take every write into files no restart reads.
  :meth:`StateDir.moved` says so, and :meth:`StateDir.open` then opens what the path names now.
- Never created again once in use: a directory that went (removed, an unmount) was taken away
  on purpose, and is waited for.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW
APPEND_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW
READ_FLAGS = os.O_RDONLY | _NOFOLLOW

# ``os.write``'s shape. Tests pass one that fails like a full or read-only disk would: neither
# can be made on demand without privileges, and an open descriptor ignores later permission
# changes, so the write call is where those faults really arrive.
Write = Callable[[int, memoryview], int]


class Unusable(OSError):
    """The directory that was in use is not at the path (or what is there may not be used)."""


class StateDir:
    """One directory held open. Not thread-safe (the journal's caller serialises access)."""

    def __init__(self, path: Path, write: Write = os.write) -> None:
        self.path = path
        self._write = write
        self._fd: int | None = None
        self._in_use = False  # something was written: the directory is not created again

    def open(self) -> int:
        """The directory's descriptor: the one held while the path still names it, else what
        the path names now (created only before anything was written in it).

        Raises :class:`Unusable` when a directory that was in use is not back (or what came back
        is a symlink, or others may write to it), OSError when it cannot be created or opened."""
        if self._fd is not None:
            if self.moved() is None:
                return self._fd
            self.close()
        if not self._in_use:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, _DIR_FLAGS)
        except OSError as exc:
            if not self._in_use:
                raise
            raise Unusable(_gone_reason(self.path, exc)) from exc
        why = _unsafe(os.fstat(fd))
        if why is not None:
            os.close(fd)
            raise Unusable(why)
        self._fd = fd
        return fd

    def moved(self) -> str | None:
        """Why the path no longer names the directory held open, or None (also when none is)."""
        if self._fd is None:
            return None
        try:
            named = os.lstat(self.path)
        except OSError as exc:
            return _gone_reason(self.path, exc)
        if stat.S_ISLNK(named.st_mode):
            return "replaced by a symlink, which the journal never follows"
        if not stat.S_ISDIR(named.st_mode):
            return "replaced by something that is not a directory"
        held = os.fstat(self._fd)
        if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            return "replaced by another directory"
        if held.st_nlink == 0:
            return "removed"
        return None

    def file_moved(self, name: str, fd: int) -> str | None:
        """Why ``name`` in the directory (or the directory itself) is no longer the file open as
        ``fd``, or None."""
        why = self.moved()
        if why is not None or self._fd is None:
            return why
        try:
            named = os.stat(name, dir_fd=self._fd, follow_symlinks=False)
        except OSError:
            return f"{name} was removed"
        held = os.fstat(fd)
        if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            return f"{name} was replaced"
        return None

    def open_append(self, name: str) -> int:
        return os.open(name, APPEND_FLAGS, 0o600, dir_fd=self.open())

    def replace(self, name: str, data: bytes) -> None:
        """Write ``name`` atomically: a temporary file created exclusively, fsynced, renamed over
        ``name``, and the directory fsynced."""
        dir_fd = self.open()
        tmp = f".{name}.tmp"
        fd = _create_new(dir_fd, tmp)
        try:
            write_all(self._write, fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)  # make the rename itself durable
        self._in_use = True

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def check_state_dir(path: Path) -> str | None:
    """Why ``path`` must not hold the journal (None: it may, or it does not exist yet). A
    directory another user can write to lets them plant links and files the exporter would then
    trust; a symlink could be swapped for one to any directory."""
    try:
        info = os.lstat(path)
    except OSError:
        return None  # missing (created later), or not a directory: the writes report it
    if stat.S_ISLNK(info.st_mode):
        return "a symlink, which the journal never follows (give the directory itself)"
    if not stat.S_ISDIR(info.st_mode):
        return None  # reported by the writes that fail
    return _unsafe(info)


def read_nofollow(path: Path, limit: int) -> bytes:
    """A file's bytes, not through a symlink (ELOOP), at most ``limit`` (:class:`TooLarge`)."""
    fd = os.open(path, READ_FLAGS)
    with os.fdopen(fd, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"larger than {limit} bytes")
    return data


class TooLarge(OSError):
    """A state file over its size limit."""


def write_all(write: Write, fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = write(fd, view)
        view = view[written:]


def _create_new(dir_fd: int, name: str) -> int:
    """Create ``name`` exclusively (``O_EXCL``: never an existing file, never a symlink's
    target). A leftover (a crash between create and rename, or something planted) is unlinked
    first: unlinking a symlink removes the link, not its target."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
    try:
        return os.open(name, flags, 0o600, dir_fd=dir_fd)
    except FileExistsError:
        os.unlink(name, dir_fd=dir_fd)
        return os.open(name, flags, 0o600, dir_fd=dir_fd)


def _unsafe(info: os.stat_result) -> str | None:
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}; chmod go-w)"
    if info.st_uid not in (0, os.geteuid()):
        return f"owned by another user (uid {info.st_uid})"
    if info.st_nlink == 0:
        return "removed (still mounted or held open, but no longer in any directory)"
    return None


def _gone_reason(path: Path, exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "removed"
    if exc.errno == errno.ELOOP or path.is_symlink():
        return "replaced by a symlink, which the journal never follows"
    if isinstance(exc, NotADirectoryError):
        return "replaced by something that is not a directory"
    return f"cannot be opened: {exc.strerror or exc}"
