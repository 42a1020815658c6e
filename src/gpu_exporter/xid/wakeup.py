"""What the kernel-log reader waits on between reads of a regular file: a change to the file
(inotify) or a poke (stop, a drain asked for), instead of waking every poll interval for nothing.

- :class:`Poke` is a self-pipe: ``poke()`` from any thread makes the reader's ``select`` return.
- :class:`FileWatch` is an inotify watch on the open file itself (through ``/proc/self/fd``, so it
  is the inode being read, not whatever the path names later): appended to or truncated
  (``IN_MODIFY``), unlinked or renamed away (``IN_ATTRIB``: the link count; ``IN_MOVE_SELF``,
  ``IN_DELETE_SELF``). Where inotify is unavailable (no libc symbol, ``ENOSYS``, the per-user
  watch limit) it is ``None`` and the reader polls as before.

Standard library only (``ctypes`` for the two inotify calls Python does not wrap).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVE_SELF = 0x00000800
IN_DELETE_SELF = 0x00000400
WATCH_MASK = IN_MODIFY | IN_ATTRIB | IN_MOVE_SELF | IN_DELETE_SELF
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC


class Poke:
    """A self-pipe opened by the reader thread for as long as it follows a file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: tuple[int, int] | None = None

    def open(self) -> int:
        """The end to ``select`` on."""
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with self._lock:
            self._fds = (read_fd, write_fd)
        return read_fd

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, None
        for fd in fds or ():
            os.close(fd)

    def poke(self) -> None:
        with self._lock:
            if self._fds is not None:
                with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
                    os.write(self._fds[1], b"!")

    @staticmethod
    def clear(fd: int) -> None:
        drain(fd)


class FileWatch:
    """An inotify descriptor watching one open file; readable when the file changed."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, file_fd: int) -> FileWatch | None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)  # this process's own symbols: libc's
            libc.inotify_init1.argtypes = [ctypes.c_int]
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        except (OSError, AttributeError):
            return None
        ino = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if ino < 0:
            return None
        target = f"/proc/self/fd/{file_fd}".encode()
        if libc.inotify_add_watch(ino, target, WATCH_MASK) < 0:
            os.close(ino)
            return None
        return cls(ino)

    def clear(self) -> None:
        drain(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def drain(fd: int) -> None:
    """Read a non-blocking descriptor until it is empty."""
    with contextlib.suppress(BlockingIOError, InterruptedError):
        while os.read(fd, 4096):
            pass
