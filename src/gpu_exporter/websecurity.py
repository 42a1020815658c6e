"""What a web config file (``--web.config.file``) says about the endpoints: TLS, basic-auth users,
response headers and a rate limit, as frozen values (a leaf).

``http/webconfig.py`` reads and checks the file into a :class:`WebConfig`; the CLI puts it in
``Config.web`` and the HTTP side (listener, guard, reloads) applies it. The values live here,
apart from the parser, so that ``config`` can name them without importing the HTTP side.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TlsSettings:
    """The server side of TLS. ``client_auth`` is the configured type. ``fixed`` holds what a
    running listener cannot change (the protocol versions, cipher suites and whether client
    certificates are asked for are set when a connection starts; only the certificate, key and
    client CAs follow a newer context): a reload that changes it needs a restart."""

    context: ssl.SSLContext = field(compare=False, repr=False)
    client_auth: str
    client_allowed_sans: frozenset[str]
    fixed: tuple[Any, ...] = ()


@dataclass(frozen=True)
class RateLimit:
    """A token bucket: one request per ``interval`` seconds, up to ``burst`` at once."""

    interval: float
    burst: int


@dataclass(frozen=True)
class WebConfig:
    source: Path
    tls: TlsSettings | None = None
    users: tuple[tuple[str, bytes], ...] = ()  # user -> bcrypt hash
    headers: tuple[tuple[str, str], ...] = ()
    rate_limit: RateLimit | None = None
    # The files it was built from (itself, certificate, key, client CAs): what a reload watches.
    files: tuple[Path, ...] = ()

    @property
    def auth_required(self) -> bool:
        return bool(self.users)
