"""``GET /metrics`` answered straight from the socket; every other request goes to aiohttp.

A scrape is a few hundred bytes of request head answered with bytes the sampler already rendered
(and, for gzip, compressed once per render: ``gzipped.py``). aiohttp spends about 60 us of event
loop per request on it (request and response objects, header multidicts, the middleware chain,
signals) against about 10 us for the work itself; with 8 scrapers that overhead, not the sampler,
set the scrape p99 (docs/performance.md, "Goals"). So every connection starts on this protocol:

- a request head that is exactly a plain ``GET /metrics`` (HTTP/1.1, no query, no body, no
  upgrade, nothing the strict check below doubts) is answered here, with the same headers,
  limits and authentication as through aiohttp (``RequestGuard``);
- anything else (another path, a body, HTTP/1.0, a malformed or oversized head) hands the
  connection, with the bytes read so far, to aiohttp's own protocol, which keeps it from then on
  and answers exactly as it always did (400s and their counting included).

The guard's timeouts hold here too: a connection with no complete request head within
``--web.read-timeout`` (from its start or its last response) is closed, and a response the client
does not take within ``--web.write-timeout`` drops the connection (``write_timeout``).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol

from aiohttp.http import SERVER_SOFTWARE

from ..exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Exposition,
    accepts_gzip,
    wants_openmetrics,
)
from ..logs import get_logger
from .gzipped import GzipBodies
from .server import MAX_HEADERS
from .webguard import REALM, REFUSAL_STATUS, RequestGuard

# A scrape's head is a few hundred bytes; a longer one is not ours to judge (aiohttp has the
# limits and the 400s).
MAX_HEAD_BYTES = 8192
END_OF_HEAD = b"\r\n\r\n"
REQUEST_LINE = b"GET /metrics HTTP/1.1"
# A header name is a token (RFC 9110 5.1); values hold no control bytes but tab.
_HEADER = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*")
# Headers that mean a body, a protocol switch or an interim response: aiohttp's to handle.
_NOT_OURS = frozenset({b"content-length", b"transfer-encoding", b"upgrade", b"expect"})
_WANTED = frozenset({b"accept", b"accept-encoding", b"authorization", b"connection"})

_log = get_logger("http")


class ExpositionSource(Protocol):
    @property
    def exposition(self) -> Exposition: ...


@dataclass(frozen=True)
class Scrape:
    """A request head the fast path answers: what content negotiation and the guard look at."""

    accept: str = ""
    accept_encoding: str = ""
    authorization: str | None = None
    close: bool = False  # ``Connection: close``: answer, then close


def parse_scrape(head: bytes) -> Scrape | None:
    """The scrape ``head`` (without its blank line) asks for, or None when it is anything but a
    plain, well-formed ``GET /metrics`` (aiohttp then takes the connection)."""
    request_line, _, rest = head.partition(b"\r\n")
    if request_line != REQUEST_LINE:
        return None
    lines = rest.split(b"\r\n") if rest else []
    if len(lines) > MAX_HEADERS:
        return None
    wanted: dict[bytes, bytes] = {}
    for line in lines:
        match = _HEADER.fullmatch(line)
        if match is None:  # obs-fold, a stray CR or LF, a control byte, no colon
            return None
        name = match.group(1).lower()
        if name in _NOT_OURS or (name in _WANTED and name in wanted):
            return None
        if name in _WANTED:
            wanted[name] = match.group(2)
    connection = wanted.get(b"connection", b"").lower()
    return Scrape(
        accept=_text(wanted.get(b"accept", b"")),
        accept_encoding=_text(wanted.get(b"accept-encoding", b"")),
        authorization=_text(wanted[b"authorization"]) if b"authorization" in wanted else None,
        close=b"close" in (token.strip() for token in connection.split(b",")),
    )


def _text(value: bytes) -> str:
    """A header value as aiohttp decodes one (UTF-8, undecodable bytes kept as surrogates)."""
    return value.decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class _Built:
    """A 200 response kept for reuse, and what it was built from."""

    exposition: Exposition
    date: str
    headers: Mapping[str, str]
    response: bytes

    def fits(self, exposition: Exposition, date: str, headers: Mapping[str, str]) -> bool:
        return exposition is self.exposition and date == self.date and headers is self.headers


class FastPath:
    """What every fast-path connection shares: the exposition, the guard, the gzip bodies, and
    the way to aiohttp for requests that are not plain scrapes."""

    def __init__(
        self,
        sampler: ExpositionSource,
        guard: RequestGuard,
        gzip_bodies: GzipBodies,
        aiohttp_protocol: Callable[[], asyncio.Protocol],
        *,
        read_timeout: float,
        write_timeout: float,
    ) -> None:
        self.guard = guard
        self.aiohttp_protocol = aiohttp_protocol
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self._sampler = sampler
        self._gzip = gzip_bodies
        self._connections: set[ScrapeConnection] = set()
        self._date = (0, "")
        self._responses: dict[tuple[bool, bool, bool], _Built] = {}

    def connection(self) -> ScrapeConnection:
        """The protocol factory for the listening socket."""
        return ScrapeConnection(self)

    def opened(self, connection: ScrapeConnection) -> None:
        self._connections.add(connection)

    def closed(self, connection: ScrapeConnection) -> None:
        self._connections.discard(connection)

    def close_all(self) -> None:
        """Close every connection still on the fast path (at shutdown)."""
        for connection in list(self._connections):
            connection.close()

    def answer_at_once(self, scrape: Scrape, transport: asyncio.BaseTransport) -> bytes | None:
        """The answer to ``scrape`` when nothing needs awaiting; None: await :meth:`answer`
        (bcrypt to run, or the gzip body of this render still to be built)."""
        refused = self.guard.over_limit()
        if refused is not None:
            return self.refusal(refused, scrape.close)
        if not self.guard.admits_at_once(transport, scrape.authorization):
            return None
        return self._ok(scrape, self._sampler.exposition)

    async def answer(self, scrape: Scrape, transport: asyncio.BaseTransport) -> bytes:
        """The answer to ``scrape``, which :meth:`answer_at_once` let past the limits.

        A request slot (``--web.max-requests``) is held while the credentials are checked, not
        while the scrape waits for its render's gzip body: that is built once for every scrape
        waiting on it, so a burst of scrapers after a render costs no more work than one (64
        scrapers used to be turned away 503 for the millisecond it took)."""
        with self.guard.slot():
            refused = await self.guard.authorize(transport, scrape.authorization)
        if refused is not None:
            return self.refusal(refused, scrape.close)
        exposition = self._sampler.exposition
        ready = self._ok(scrape, exposition)
        if ready is not None:
            return ready
        await self._gzip.body(exposition, openmetrics=wants_openmetrics(scrape.accept))
        built = self._ok(scrape, exposition)
        assert built is not None, "the gzip body is kept by the exposition once built"
        return built

    def _ok(self, scrape: Scrape, exposition: Exposition) -> bytes | None:
        """The whole 200 response, or None when its gzip body is not built yet.

        Built once per render, variant and second (the Date header) and then reused: head and
        body in one buffer are one ``send``, where two would let a sampling thread take the GIL
        in between."""
        openmetrics = wants_openmetrics(scrape.accept)
        gzipped = accepts_gzip(scrape.accept_encoding)
        variant = (openmetrics, gzipped, scrape.close)
        date = self._http_date()
        headers = self.guard.response_headers
        cached = self._responses.get(variant)
        if cached is not None and cached.fits(exposition, date, headers):
            return cached.response
        if gzipped:
            body = exposition.cached_gzip(openmetrics=openmetrics)
            if body is None:
                return None
        else:
            body = exposition.body(openmetrics=openmetrics, gzipped=False)
        response = self._ok_head(openmetrics, len(body), gzipped, scrape.close) + body
        self._responses[variant] = _Built(exposition, date, headers, response)
        return response

    def refusal(self, reason: str, close: bool = False) -> bytes:
        """A complete response (head and body) for a request the guard refused."""
        status = REFUSAL_STATUS[reason]
        return self.plain(status, close, challenge=status is HTTPStatus.UNAUTHORIZED)

    def plain(self, status: HTTPStatus, close: bool, *, challenge: bool = False) -> bytes:
        """A complete text/plain response whose body is the status phrase, as aiohttp's."""
        body = f"{status.phrase}\n".encode()
        extra = f"WWW-Authenticate: {REALM}\r\n" if challenge else ""
        head = self._head(
            f"HTTP/1.1 {status.value} {status.phrase}\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n{extra}",
            close,
        )
        return head + body

    def _ok_head(self, openmetrics: bool, length: int, gzipped: bool, close: bool) -> bytes:
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        encoding = "Content-Encoding: gzip\r\n" if gzipped else ""
        return self._head(
            f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n{encoding}"
            f"Vary: Accept, Accept-Encoding\r\nContent-Length: {length}\r\n",
            close,
        )

    def _head(self, start: str, close: bool) -> bytes:
        """``start`` plus the headers every response carries, and the blank line."""
        configured = self.guard.response_headers
        extra = "".join(f"{name}: {value}\r\n" for name, value in configured.items())
        closing = "Connection: close\r\n" if close else ""
        common = f"Date: {self._http_date()}\r\nServer: {SERVER_SOFTWARE}\r\n"
        return f"{start}{common}{extra}{closing}\r\n".encode()  # UTF-8, as aiohttp encodes

    def _http_date(self) -> str:
        """The Date header's value, formatted once a second."""
        now = int(time.time())
        if now != self._date[0]:
            self._date = (now, formatdate(now, usegmt=True))
        return self._date[1]


class ScrapeConnection(asyncio.Protocol):
    """One connection, answered here while it asks for plain scrapes (pipelined ones in order),
    handed to aiohttp's protocol at its first request that is not one."""

    def __init__(self, path: FastPath) -> None:
        self._path = path
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiting: asyncio.Task[None] | None = None  # an answer awaiting bcrypt or gzip
        self._write_paused = False
        self._closed = False  # close() called: nothing more is read or written
        self._failed_write = False  # the connection broke while an answer was written
        # --web.read-timeout for the next head: when it runs out (None while a request is being
        # answered), and the one timer that checks it (see _arm_idle).
        self._idle_deadline: float | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._last_head = b""  # a scraper sends the same head every time: parsed once
        self._last_scrape: Scrape | None = None
        self._stalled: asyncio.TimerHandle | None = None  # --web.write-timeout for a response

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._path.opened(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._serve()

    def pause_writing(self) -> None:
        """The client is not taking what was written: read no more requests until it does, and
        drop the connection if it does not within --web.write-timeout."""
        self._write_paused = True
        if self._transport is not None:
            self._transport.pause_reading()
        self._stalled = asyncio.get_running_loop().call_later(
            self._path.write_timeout, self._on_stalled
        )

    def resume_writing(self) -> None:
        self._write_paused = False
        _cancel(self._stalled)
        if self._transport is None or self._closed:
            return
        self._transport.resume_reading()
        self._arm_idle()
        self._serve()

    def connection_lost(self, exc: Exception | None) -> None:
        self._path.closed(self)
        self._stop_idle()
        _cancel(self._stalled)
        if self._waiting is not None:
            self._waiting.cancel()
        unfinished = bool(self._write_paused or self._waiting or self._failed_write or self._buffer)
        if isinstance(exc, ConnectionError) and unfinished:
            self._path.guard.note_dropped("reset", self._peer())
        self._transport = None

    def close(self) -> None:
        """Close once what was written is sent."""
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def _open(self) -> bool:
        """Still taking requests: not closed by us, and not broken (a failed write closes the
        transport at once; connection_lost follows on the next loop iteration)."""
        return self._transport is not None and not self._closed and not self._transport.is_closing()

    def _serve(self) -> None:
        """Answer every complete scrape head in the buffer, in order, while the client takes the
        answers; hand the connection to aiohttp at the first head that is not a plain scrape."""
        while self._open() and self._waiting is None and not self._write_paused:
            end = self._buffer.find(END_OF_HEAD)
            if end < 0 and len(self._buffer) <= MAX_HEAD_BYTES and b"\n\n" not in self._buffer:
                return  # the head is still arriving
            scrape = self._parse(bytes(self._buffer[:end])) if 0 <= end <= MAX_HEAD_BYTES else None
            if scrape is None:
                self._hand_over()
                return
            del self._buffer[: end + len(END_OF_HEAD)]
            self._idle_deadline = None  # a head came in time; the answer re-arms the timeout
            self._answer(scrape)

    def _parse(self, head: bytes) -> Scrape | None:
        if head != self._last_head:
            self._last_head, self._last_scrape = head, parse_scrape(head)
        return self._last_scrape

    def _answer(self, scrape: Scrape) -> None:
        assert self._transport is not None
        answer = self._path.answer_at_once(scrape, self._transport)
        if answer is not None:
            self._send(answer, scrape.close)
            return
        self._transport.pause_reading()
        self._waiting = asyncio.ensure_future(self._answer_later(scrape))

    async def _answer_later(self, scrape: Scrape) -> None:
        assert self._transport is not None
        try:
            answer = await self._path.answer(scrape, self._transport)
        except Exception:  # a bug, not the client's doing: a 500, as aiohttp answers one
            _log.exception("error handling request", path="/metrics")
            answer = self._path.plain(HTTPStatus.INTERNAL_SERVER_ERROR, True)
            scrape = Scrape(close=True)
        finally:
            self._waiting = None
        if not self._open():
            return
        self._send(answer, scrape.close)
        if self._open() and not self._write_paused:
            self._transport.resume_reading()
            self._serve()

    def _send(self, answer: bytes, close: bool) -> None:
        assert self._transport is not None
        self._transport.write(answer)
        if self._transport.is_closing():  # the write failed: the client reset the connection
            self._failed_write = True
        elif close:
            self.close()
        elif not self._write_paused:
            self._arm_idle()

    def _hand_over(self) -> None:
        """aiohttp's protocol takes the transport, and the bytes read so far, for good."""
        transport = self._transport
        assert transport is not None
        self._stop_idle()
        self._path.closed(self)
        self._transport = None
        protocol = self._path.aiohttp_protocol()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._buffer:
            protocol.data_received(bytes(self._buffer))
        self._buffer.clear()

    def _arm_idle(self) -> None:
        """Give the client --web.read-timeout from now for its next head.

        Called after every answer, so it only moves a deadline: the timer armed earlier stays,
        and when it fires it waits out what is left (:meth:`_on_idle`). A new timer per request
        (made, pushed on the loop's heap, cancelled) was an eighth of a keep-alive scrape's CPU."""
        loop = asyncio.get_running_loop()
        self._idle_deadline = loop.time() + self._path.read_timeout
        if self._idle is None:
            self._idle = loop.call_at(self._idle_deadline, self._on_idle)

    def _on_idle(self) -> None:
        self._idle = None
        deadline = self._idle_deadline
        if deadline is None:
            return  # a request is being answered; its answer arms the timeout again
        loop = asyncio.get_running_loop()
        if loop.time() < deadline:
            self._idle = loop.call_at(deadline, self._on_idle)
        else:
            self.close()

    def _stop_idle(self) -> None:
        _cancel(self._idle)
        self._idle = self._idle_deadline = None

    def _on_stalled(self) -> None:
        if self._transport is not None:
            self._path.guard.note_dropped("write_timeout", self._peer())
            self._transport.abort()

    def _peer(self) -> str | None:
        peer = self._transport.get_extra_info("peername") if self._transport else None
        return str(peer[0]) if isinstance(peer, tuple) and peer else None


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()
