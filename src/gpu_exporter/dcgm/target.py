"""Where the DCGM host engine is (``--dcgm.address``), parsed once by the settings."""

from __future__ import annotations

from dataclasses import dataclass

# A host engine's unix socket address [dcgm_structs.h ~285-310]. Here, not in structs.py, so
# that Config parses --dcgm.address without loading the binding (ctypes layouts).
UNIX_PREFIX = "unix://"


@dataclass(frozen=True)
class Target:
    """Where the host engine is: ``address`` (``host[:port]`` or a socket path), or embedded."""

    address: str | None = None
    unix_socket: bool = False

    @property
    def embedded(self) -> bool:
        return self.address is None

    def describe(self) -> str:
        if self.address is None:
            return "embedded"
        return f"{UNIX_PREFIX}{self.address}" if self.unix_socket else self.address


def parse_target(text: str) -> Target:
    """``host:port``, ``host`` (port 5555) or ``unix:///path``; ValueError says what is wrong."""
    text = text.strip()
    if text.startswith(UNIX_PREFIX):
        path = text.removeprefix(UNIX_PREFIX)
        if not path.startswith("/"):
            raise ValueError(f"{text!r}: a unix socket address is unix:///absolute/path")
        return Target(path, unix_socket=True)
    if "://" in text:
        raise ValueError(f"{text!r}: use host:port or unix:///path")
    host, _, port = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    if not host or (port and not (port.isdigit() and 0 < int(port) < 65536)):
        raise ValueError(f"{text!r}: expected host:port (port 1-65535) or unix:///path")
    return Target(text)
