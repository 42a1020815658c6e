"""Scrapes are answered beside aiohttp, straight from the socket (``http/fastpath.py``). A scraper
must not be able to tell: the same bytes, headers, refusals and timeouts as through aiohttp, and
any other request on the same connection answered by aiohttp as before."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.app import Exporter
from gpu_exporter.config import SimulatorConfig
from gpu_exporter.http.webconfig import load_web_config
from tests.helpers import make_config, one, parse_exposition, running_exporter
from tests.web_helpers import write_web_config

# A request aiohttp's router sends to the same handler, which the fast path leaves to aiohttp.
VIA_AIOHTTP = "/metrics?via=aiohttp"
WEB_CONFIG = (
    "http_server_config:\n"
    "  headers: {X-Content-Type-Options: nosniff, X-Frame-Options: deny}\n"
    "rate_limit: {interval: 1h, burst: 4}\n"
)


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


def request(path: str = "/metrics", **headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_response(reader: asyncio.StreamReader) -> Response:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)  # a bound, not a wait
    status_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    headers = {name.lower(): value for name, value in headers.items()}
    body = await reader.readexactly(int(headers["content-length"]))
    return Response(int(status_line.split(" ")[1]), headers, body)


@asynccontextmanager
async def connection(exporter: Exporter) -> AsyncIterator[Stream]:
    reader, writer = await asyncio.open_connection("127.0.0.1", exporter.port)
    try:
        yield reader, writer
    finally:
        writer.close()


async def exchange(exporter: Exporter, raw: bytes, responses: int = 1) -> list[Response]:
    """Send ``raw`` (one or more requests) on a new connection; read ``responses`` answers."""
    async with connection(exporter) as (reader, writer):
        writer.write(raw)
        return [await read_response(reader) for _ in range(responses)]


@asynccontextmanager
async def exporter_with(
    tmp_path: Path, web_config: str | None = None, **overrides: Any
) -> AsyncIterator[Exporter]:
    path = write_web_config(tmp_path, web_config) if web_config else None
    config = make_config(
        simulator=SimulatorConfig(),
        fast_interval=0.2,
        slow_interval=1.0,
        kmsg_path=tmp_path / "kmsg",
        state_dir=tmp_path / "state",
        web_config_file=path,
        web=load_web_config(path) if path else None,
        **overrides,
    )
    async with running_exporter(config) as exporter:
        yield exporter


def comparable(response: Response) -> tuple[int, dict[str, str], bytes]:
    headers = dict(response.headers)
    assert headers.pop("date", "").endswith(" GMT"), "every response carries a Date"
    return response.status, headers, response.body


async def test_a_scrape_is_answered_byte_for_byte_as_aiohttp_answers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variants = [
        {},
        {"Accept-Encoding": "gzip"},
        {"Accept": "application/openmetrics-text;version=1.0.0", "Accept-Encoding": "gzip"},
        {"Accept": "application/openmetrics-text;version=1.0.0"},
        {"Accept-Encoding": "gzip;q=0"},
    ]
    async with exporter_with(tmp_path, WEB_CONFIG.replace("burst: 4", "burst: 100")) as exporter:
        # One render, kept: both paths must serve the very same exposition.
        kept = exporter.sampler.exposition
        monkeypatch.setattr(type(exporter.sampler), "exposition", property(lambda _: kept))
        for headers in variants:
            [fast] = await exchange(exporter, request(**headers))
            [slow] = await exchange(exporter, request(VIA_AIOHTTP, **headers))
            assert comparable(fast) == comparable(slow), f"fast path differs for {headers}"
            assert fast.headers["x-frame-options"] == "deny", "the web config's headers are sent"
        [zipped] = await exchange(exporter, request(**{"Accept-Encoding": "gzip"}))
        text = parse_exposition(gzip.decompress(zipped.body).decode())
        assert one(text, "gpu_exporter_build_info") == 1, "a gzip scrape is the whole exposition"


async def test_refusals_are_the_same_on_both_paths_and_counted(tmp_path: Path) -> None:
    async with exporter_with(tmp_path, WEB_CONFIG) as exporter:
        allowed = await exchange(exporter, request() * 4, responses=4)
        assert [r.status for r in allowed] == [200] * 4, "the burst of 4 is allowed"
        [fast] = await exchange(exporter, request())
        [slow] = await exchange(exporter, request(VIA_AIOHTTP))
        assert fast.status == 429, "over the rate limit on the fast path"
        assert comparable(fast) == comparable(slow)
        assert exporter.guard.rejected["rate_limit"] == 2, "each refusal counted once"


async def test_other_requests_on_a_scrape_connection_are_answered_by_aiohttp(
    tmp_path: Path,
) -> None:
    async with exporter_with(tmp_path) as exporter, connection(exporter) as (reader, writer):
        for path, expect in [("/metrics", b"gpu_exporter_build_info"), ("/healthz", b"ok\n")]:
            writer.write(request(path))
            response = await read_response(reader)
            assert response.status == 200, path
            assert expect in response.body, path
        writer.write(request("/metrics"))  # aiohttp has the connection now: still a scrape
        response = await read_response(reader)
        assert response.status == 200
        assert b"gpu_exporter_build_info" in response.body


async def test_pipelined_scrapes_are_answered_in_order(tmp_path: Path) -> None:
    raw = request() + request(**{"Accept-Encoding": "gzip"}) + request("/healthz") + request()
    async with exporter_with(tmp_path) as exporter:
        answers = await exchange(exporter, raw, responses=4)
    assert [a.status for a in answers] == [200] * 4
    assert "content-encoding" not in answers[0].headers
    assert answers[1].headers["content-encoding"] == "gzip"
    assert answers[2].body.startswith(b"ok\n"), "the third request went to aiohttp, in its turn"
    # A round (every 0.2 s here) may land between the first answer and the fourth: their values
    # may differ, their kind may not.
    assert answers[3].headers["content-type"] == answers[0].headers["content-type"]
    assert "content-encoding" not in answers[3].headers
    first_line = answers[0].body.split(b"\n", 1)[0]
    assert answers[3].body.split(b"\n", 1)[0] == first_line, "the fourth answer is no exposition"


async def test_connection_close_is_honoured(tmp_path: Path) -> None:
    async with exporter_with(tmp_path) as exporter, connection(exporter) as (reader, writer):
        writer.write(request(Connection="close"))
        response = await read_response(reader)
        assert response.headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 10) == b"", "closed after the answer"


async def test_an_idle_connection_is_closed_after_the_read_timeout(tmp_path: Path) -> None:
    async with (
        exporter_with(tmp_path, web_read_timeout=0.3) as exporter,
        connection(exporter) as (reader, writer),
    ):
        writer.write(request())
        assert (await read_response(reader)).status == 200
        closed = await asyncio.wait_for(reader.read(), 10)
        assert closed == b"", "a keep-alive connection with no next request is closed"


async def test_the_read_timeout_counts_from_the_last_answer(tmp_path: Path) -> None:
    """A client that keeps asking within the timeout keeps its connection past the first
    timeout (the idle timer moves with each answer); once it stops asking, it is closed."""
    timeout, gap = 1.0, 0.4
    async with (
        exporter_with(tmp_path, web_read_timeout=timeout) as exporter,
        connection(exporter) as (reader, writer),
    ):
        started = asyncio.get_running_loop().time()
        for _ in range(3):  # the third request comes 0.8 s in; the fourth 1.2 s in
            writer.write(request())
            assert (await read_response(reader)).status == 200
            await asyncio.sleep(gap)  # the client's think time is what is under test
        writer.write(request())
        answer = await read_response(reader)
        assert answer.status == 200, "a connection used within its timeout was closed"
        assert asyncio.get_running_loop().time() - started > timeout, "the test asked too fast"
        closed = await asyncio.wait_for(reader.read(), 10)
        assert closed == b"", "the connection stayed open once its client stopped asking"
