"""A scraper's connection, as it meets the exporter over loopback: keep-alive and pipelined scrapes
answered in order, ``Connection: close`` honoured, the read timeout counted from the last answer,
every scrape of one render served the same bytes, refusals counted once each, scrapers waiting for
a render's gzip body holding no request slot, and requests at the edges of HTTP/1.1 answered as
HTTP says."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpu_exporter.app import Exporter, start_web_server
from gpu_exporter.config import SimulatorConfig
from gpu_exporter.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Exposition,
    Sample,
    gauge,
    render,
)
from gpu_exporter.http.gzipped import GzipBodies
from gpu_exporter.http.server import GZIP_KEY, make_web_app
from gpu_exporter.http.webconfig import load_web_config
from gpu_exporter.http.webguard import RequestGuard
from tests.helpers import make_config, one, parse_exposition, running_exporter
from tests.integration.test_web_security import StubSampler
from tests.web_helpers import write_web_config

WEB_CONFIG = (
    "http_server_config:\n"
    "  headers: {X-Content-Type-Options: nosniff, X-Frame-Options: deny}\n"
    "rate_limit: {interval: 1h, burst: 4}\n"
)
OPENMETRICS = "application/openmetrics-text;version=1.0.0"
POWER = gauge("gpu_power_watts", "Power draw, in watts.")


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


def request(path: str = "/metrics", method: str = "GET", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_response(reader: asyncio.StreamReader, *, head_only: bool = False) -> Response:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)  # a bound, not a wait
    status_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    headers = {name.lower(): value for name, value in headers.items()}
    length = 0 if head_only else int(headers.get("content-length", "0"))
    body = await reader.readexactly(length)
    return Response(int(status_line.split(" ")[1]), headers, body)


@asynccontextmanager
async def connection(port: int) -> AsyncIterator[Stream]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()


async def exchange(port: int, raw: bytes, responses: int = 1) -> list[Response]:
    """Send ``raw`` (one or more requests) on a new connection; read ``responses`` answers."""
    async with connection(port) as (reader, writer):
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


def without_date(response: Response) -> tuple[int, dict[str, str], bytes]:
    headers = dict(response.headers)
    assert headers.pop("date", "").endswith(" GMT"), "every response carries a Date"
    return response.status, headers, response.body


async def test_every_scrape_of_one_render_is_served_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with exporter_with(tmp_path, WEB_CONFIG.replace("burst: 4", "burst: 100")) as exporter:
        kept = exporter.sampler.exposition  # one render, kept: every scrape below reads it
        monkeypatch.setattr(type(exporter.sampler), "exposition", property(lambda _: kept))
        port = exporter.port
        answers = {}
        for name, headers in {
            "text": {},
            "text, gzip": {"Accept_Encoding": "gzip"},
            "openmetrics": {"Accept": OPENMETRICS},
            "openmetrics, gzip": {"Accept": OPENMETRICS, "Accept_Encoding": "gzip"},
            "gzip refused": {"Accept_Encoding": "gzip;q=0"},
        }.items():
            kept_alive = await exchange(port, request(**headers) * 2, responses=2)
            [fresh] = await exchange(port, request(**headers))
            first = without_date(kept_alive[0])
            assert without_date(kept_alive[1]) == first, f"{name}: a kept connection's scrapes"
            assert without_date(fresh) == first, f"{name}: a new connection's scrape"
            assert fresh.headers["x-frame-options"] == "deny", "the web config's headers are sent"
            assert fresh.headers["vary"] == "Accept, Accept-Encoding"
            answers[name] = fresh
    assert answers["text"].headers["content-type"] == TEXT_CONTENT_TYPE
    assert answers["openmetrics"].headers["content-type"] == OPENMETRICS_CONTENT_TYPE
    for name in ("text", "openmetrics", "gzip refused"):
        assert "content-encoding" not in answers[name].headers, name
    for plain in ("text", "openmetrics"):
        zipped = answers[f"{plain}, gzip"]
        assert zipped.headers["content-encoding"] == "gzip"
        assert zipped.headers["content-type"] == answers[plain].headers["content-type"]
        assert gzip.decompress(zipped.body) == answers[plain].body, f"{plain}: the gzip body"
    assert answers["gzip refused"].body == answers["text"].body
    text = parse_exposition(answers["text"].body.decode())
    assert one(text, "gpu_exporter_build_info") == 1, "a scrape is the whole exposition"


async def test_refusals_are_answered_alike_and_each_counted_once(tmp_path: Path) -> None:
    async with exporter_with(tmp_path, WEB_CONFIG) as exporter:
        allowed = await exchange(exporter.port, request() * 4, responses=4)
        assert [r.status for r in allowed] == [200] * 4, "the burst of 4 is allowed"
        [scrape] = await exchange(exporter.port, request())
        [other] = await exchange(exporter.port, request("/metrics?from=a-script"))
        assert scrape.status == 429, "over the rate limit"
        assert scrape.body == b"Too Many Requests\n"
        assert scrape.headers["x-frame-options"] == "deny", "refusals carry the configured headers"
        assert without_date(scrape) == without_date(other), "one refusal, whatever the query"
        assert exporter.guard.rejected["rate_limit"] == 2, "each refusal counted once"


async def test_one_connection_serves_scrapes_and_other_requests_in_turn(tmp_path: Path) -> None:
    async with exporter_with(tmp_path) as exporter, connection(exporter.port) as (reader, writer):
        for path, expect in [
            ("/metrics", b"gpu_exporter_build_info"),
            ("/healthz", b"ok\n"),
            ("/metrics", b"gpu_exporter_build_info"),
        ]:
            writer.write(request(path))
            response = await read_response(reader)
            assert response.status == 200, path
            assert expect in response.body, path


async def test_pipelined_requests_are_answered_in_order(tmp_path: Path) -> None:
    raw = request() + request(Accept_Encoding="gzip") + request("/healthz") + request()
    async with exporter_with(tmp_path) as exporter:
        answers = await exchange(exporter.port, raw, responses=4)
    assert [a.status for a in answers] == [200] * 4
    assert "content-encoding" not in answers[0].headers
    assert answers[1].headers["content-encoding"] == "gzip"
    assert answers[2].body.startswith(b"ok\n"), "the third answer is the health check's"
    # A round (every 0.2 s here) may land between the first answer and the fourth: their values
    # may differ, their kind may not.
    assert answers[3].headers["content-type"] == answers[0].headers["content-type"]
    assert "content-encoding" not in answers[3].headers
    first_line = answers[0].body.split(b"\n", 1)[0]
    assert answers[3].body.split(b"\n", 1)[0] == first_line, "the fourth answer is no exposition"


async def test_connection_close_is_honoured(tmp_path: Path) -> None:
    async with exporter_with(tmp_path) as exporter, connection(exporter.port) as (reader, writer):
        writer.write(request(Connection="close"))
        response = await read_response(reader)
        assert response.headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 10) == b"", "closed after the answer"


async def test_an_idle_connection_is_closed_after_the_read_timeout(tmp_path: Path) -> None:
    async with (
        exporter_with(tmp_path, web_read_timeout=0.3) as exporter,
        connection(exporter.port) as (reader, writer),
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
        connection(exporter.port) as (reader, writer),
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


# -- the web server alone, over one kept render ---------------------------------------------------


class OneRender(StubSampler):
    """A healthy sampler whose exposition is one render, kept."""

    def __init__(self) -> None:
        super().__init__()
        self.kept = render([Sample(POWER, 'gpu="0"', 300.5)], [POWER])

    @property
    def exposition(self) -> Exposition:
        return self.kept


class HeldGzip(GzipBodies):
    """gzip bodies built only when the test says so, counting who waits for one."""

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
        return await super().body(exposition, openmetrics=openmetrics)


@asynccontextmanager
async def web_server(
    guard: RequestGuard, gzip_bodies: GzipBodies | None = None
) -> AsyncIterator[int]:
    """The exporter's web app over :class:`OneRender`, listening on loopback: its port."""
    app = make_web_app(OneRender(), (), guard)  # type: ignore[arg-type]
    if gzip_bodies is not None:
        app[GZIP_KEY] = gzip_bodies
    server = await start_web_server(app, make_config(), guard)
    try:
        yield server.port
    finally:
        await server.stop()


class CountedReads(OneRender):
    """A kept render that counts the requests that told it they served it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def note_read(self) -> None:
        self.reads += 1


async def test_scrapes_and_the_status_page_tell_the_sampler_they_read_and_probes_do_not() -> None:
    """What steers rendering ahead of the scrapers is the handler's call, not reading."""
    sampler = CountedReads()
    guard = RequestGuard(None, max_requests=4)
    app = make_web_app(sampler, (), guard)  # type: ignore[arg-type]
    server = await start_web_server(app, make_config(), guard)
    told = {}
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{server.port}") as session:
            for path in ("/metrics", "/", "/status.json", "/healthz", "/readyz"):
                before = sampler.reads
                async with session.get(path) as response:
                    assert response.status == 200, f"{path} answered {response.status}"
                told[path] = sampler.reads - before
    finally:
        await server.stop()
    assert told == {"/metrics": 1, "/": 1, "/status.json": 1, "/healthz": 0, "/readyz": 0}


async def test_scrapes_waiting_for_the_gzip_body_hold_no_request_slot() -> None:
    """The body is built once for every scrape waiting on it: a burst of gzip scrapes after a
    render must not turn others away 503 (--web.max-requests) for as long as it takes."""
    guard = RequestGuard(None, max_requests=1)
    gzip_bodies = HeldGzip(waiters=3)
    async with (
        web_server(guard, gzip_bodies) as port,
        aiohttp.ClientSession(f"http://127.0.0.1:{port}", auto_decompress=False) as session,
    ):

        async def scrape(encoding: str) -> tuple[int, bytes]:
            headers = {"Accept-Encoding": encoding}
            async with session.get("/metrics", headers=headers) as response:
                return response.status, await response.read()

        waiting = [asyncio.create_task(scrape("gzip")) for _ in range(3)]
        await asyncio.wait_for(gzip_bodies.all_waiting.wait(), 10)  # a bound, not a wait
        status, plain = await scrape("identity")
        assert status == 200, "three scrapes wait on one gzip body: the one slot is free"
        gzip_bodies.release.set()
        for status, body in await asyncio.gather(*waiting):
            assert status == 200
            assert gzip.decompress(body) == plain
    assert guard.rejected["max_requests"] == 0


@pytest.mark.parametrize(
    ("raw", "status", "what"),
    [
        (
            request(Accept=OPENMETRICS, Accept_Encoding=" gzip ", Connection="keep-alive"),
            200,
            "a Prometheus scrape",
        ),
        (request("/metrics?x=1"), 200, "a query is ignored"),
        (request(Content_Length="0"), 200, "an empty body"),
        (b"GET /metrics HTTP/1.0\r\n\r\n", 200, "HTTP/1.0, no Host needed"),
        (request(method="POST"), 405, "a method /metrics has no answer for"),
        (request("/metrics/"), 404, "another path"),
        (b"GET /metrics HTTP/1.1\r\n\r\n", 400, "HTTP/1.1 without Host"),
        (b"get /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 400, "a lower-case method"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: a\r\n b\r\n\r\n", 400, "obs-fold"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Null: a\x00b\r\n\r\n", 400, "a NUL byte"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nNo colon\r\n\r\n", 400, "a line with no colon"),
    ],
)
async def test_requests_at_the_edges_of_http_are_answered_as_http_says(
    raw: bytes, status: int, what: str
) -> None:
    guard = RequestGuard(None, max_requests=4)
    async with web_server(guard) as port:
        [answer] = await exchange(port, raw)
    assert answer.status == status, f"{what}: {answer.status} {answer.body[:80]!r}"
    assert guard.rejected["bad_request"] == (1 if status == 400 else 0), f"{what}: counted"
    if b"openmetrics" in raw:
        assert answer.headers["content-type"] == OPENMETRICS_CONTENT_TYPE
        assert answer.headers["content-encoding"] == "gzip"
        assert gzip.decompress(answer.body) == OneRender().kept.openmetrics


async def test_head_of_metrics_is_the_scrape_without_its_body() -> None:
    async with (
        web_server(RequestGuard(None, max_requests=4)) as port,
        connection(port) as (reader, writer),
    ):
        writer.write(request(method="HEAD") + request())
        head = await read_response(reader, head_only=True)
        scrape = await read_response(reader)
    assert head.status == 200
    assert head.headers["content-type"] == scrape.headers["content-type"]
    assert scrape.status == 200, "no body came between the HEAD's answer and the next"
    assert scrape.body.startswith(b"# HELP ")
