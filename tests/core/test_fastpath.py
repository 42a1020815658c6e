"""Which request heads the scrape fast path answers itself (``http/fastpath.parse_scrape``):
only a plain, well-formed ``GET /metrics``; anything it might judge differently from aiohttp's
parser goes to aiohttp."""

from __future__ import annotations

import asyncio
import gzip
from types import SimpleNamespace

import pytest

from gpu_exporter.exposition import Exposition
from gpu_exporter.http.fastpath import FastPath, Scrape, parse_scrape
from gpu_exporter.http.gzipped import GzipBodies
from gpu_exporter.http.server import MAX_HEADERS
from gpu_exporter.http.webguard import RequestGuard

PLAIN = b"GET /metrics HTTP/1.1\r\nHost: node:9400"


def test_a_prometheus_scrape_is_parsed_for_negotiation_and_auth() -> None:
    head = (
        PLAIN + b"\r\nUser-Agent: Prometheus/3.0.0\r\nAccept: application/openmetrics-text\r\n"
        b"accept-encoding:  gzip \r\nAuthorization: Basic dTpw\r\nConnection: keep-alive"
    )
    assert parse_scrape(head) == Scrape(
        accept="application/openmetrics-text",
        accept_encoding="gzip",
        authorization="Basic dTpw",
        close=False,
    )


def test_a_head_without_headers_and_connection_close() -> None:
    assert parse_scrape(b"GET /metrics HTTP/1.1") == Scrape()
    assert parse_scrape(PLAIN + b"\r\nConnection: Keep-Alive, close") == Scrape(close=True)


@pytest.mark.parametrize(
    "head",
    [
        b"GET /metrics?x=1 HTTP/1.1",
        b"GET /metrics/ HTTP/1.1",
        b"GET /healthz HTTP/1.1",
        b"HEAD /metrics HTTP/1.1",
        b"POST /metrics HTTP/1.1",
        b"GET /metrics HTTP/1.0",
        b"GET  /metrics HTTP/1.1",
        b"get /metrics HTTP/1.1",
        PLAIN + b"\r\nContent-Length: 0",
        PLAIN + b"\r\nTransfer-Encoding: chunked",
        PLAIN + b"\r\nUpgrade: websocket",
        PLAIN + b"\r\nExpect: 100-continue",
        PLAIN + b"\r\nAccept: a\r\n b",  # obs-fold
        PLAIN + b"\r\nAccept: a\nX: b",  # a bare LF
        PLAIN + b"\r\nAccept: a\rb",  # a stray CR
        PLAIN + b"\r\nX-Null: a\x00b",
        PLAIN + b"\r\nNo colon here",
        PLAIN + b"\r\nBad Name: x",
        PLAIN + b"\r\nAuthorization: Basic a\r\nAuthorization: Basic b",
        PLAIN + b"".join(b"\r\nX-%d: v" % i for i in range(MAX_HEADERS + 1)),
    ],
)
def test_anything_else_is_left_to_aiohttp(head: bytes) -> None:
    assert parse_scrape(head) is None, f"the fast path must not answer {head[:60]!r}"


class HeldGzip(GzipBodies):
    """gzip bodies that are built only when the test says so, counting who waits for one."""

    def __init__(self, waiters: int) -> None:
        super().__init__()
        self.waiting = 0
        self.all_waiting = asyncio.Event()
        self.expected = waiters
        self.release = asyncio.Event()

    async def body(self, exposition: Exposition, *, openmetrics: bool) -> bytes:
        self.waiting += 1
        if self.waiting == self.expected:
            self.all_waiting.set()
        await self.release.wait()
        return exposition.body(openmetrics=openmetrics, gzipped=True)


async def test_scrapes_waiting_for_the_gzip_body_hold_no_request_slot() -> None:
    exposition = Exposition(text=b"up 1\n", openmetrics=b"up 1\n# EOF\n")
    sampler = SimpleNamespace(exposition=exposition)
    guard = RequestGuard(None, max_requests=1)
    gzip_bodies = HeldGzip(waiters=3)
    path = FastPath(
        sampler, guard, gzip_bodies, asyncio.Protocol, read_timeout=30, write_timeout=10
    )
    scrape = Scrape(accept_encoding="gzip")
    answers = [asyncio.ensure_future(path.answer(scrape, asyncio.BaseTransport())) for _ in "abc"]
    await gzip_bodies.all_waiting.wait()
    assert guard.over_limit() is None, "three scrapes wait on one gzip body: no slot is taken"
    gzip_bodies.release.set()
    for answer in await asyncio.gather(*answers):
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        assert answer.endswith(gzip.compress(b"up 1\n", compresslevel=1, mtime=0))
