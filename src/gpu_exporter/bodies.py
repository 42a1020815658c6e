"""Request bodies read the same way by every endpoint that reads one (the admin API, the
simulator's events): decoded as UTF-8 only, parsed without a traceback whatever the bytes, so a
bogus charset, invalid UTF-8 or a JSON document nested 30 000 deep is a 400 with one line, never
a 500. The size is bounded by the application (``client_max_size``: 413 beyond it).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

# What a body may declare as its charset: UTF-8 (or its ASCII subset); anything else is refused
# rather than looked up (an unknown codec name was a LookupError, answered 500).
CHARSETS = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})


class BadBody(ValueError):
    """The body cannot be read: the message says why, in one line."""


async def read_text(request: web.Request) -> str:
    """The body as text. Raises :class:`BadBody`."""
    charset = (request.charset or "utf-8").strip().lower()
    if charset not in CHARSETS:
        raise BadBody(f"unsupported charset {charset[:40]!r} (send UTF-8)")
    data = await request.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadBody(f"body is not UTF-8 text (invalid byte at offset {exc.start})") from None


def parse_json(text: str) -> Any:
    """``json.loads``, with every failure a :class:`BadBody`."""
    try:
        return json.loads(text)
    except RecursionError:
        raise BadBody("body is not JSON: nested too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError
        raise BadBody(f"body is not JSON: {exc}") from None
