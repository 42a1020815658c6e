"""Endpoint security as a scraper meets it: real TLS and basic auth over loopback, request limits,
slow clients, and a bad web config refused at start."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from gpu_exporter.app import start_web_server
from gpu_exporter.collectors import Cadence
from gpu_exporter.config import Config, SimulatorConfig
from gpu_exporter.http.server import make_web_app
from gpu_exporter.http.webconfig import load_web_config
from gpu_exporter.http.webguard import RequestGuard
from tests.helpers import make_config, one, parse_exposition, running_exporter
from tests.web_helpers import PASSWORD, USER, Pki, bcrypt_hash, write_web_config


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(user, password)}


GOOD = basic(USER, PASSWORD)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki.create(tmp_path)


def tls_auth_config(pki: Pki, extra_tls: str = "") -> Path:
    return write_web_config(
        pki.directory,
        "tls_server_config:\n"
        "  cert_file: server.crt\n"
        "  key_file: server.key\n"
        f"{extra_tls}"
        "http_server_config:\n"
        "  headers: {X-Content-Type-Options: nosniff}\n"
        "basic_auth_users:\n"
        f"  {USER}: {bcrypt_hash(PASSWORD)}\n",
    )


def simulated(web_config: Path | None, **overrides: Any) -> Config:
    return make_config(
        simulator=SimulatorConfig(),
        fast_interval=0.2,
        slow_interval=1.0,
        web_config_file=web_config,
        web=load_web_config(web_config) if web_config else None,
        **overrides,
    )


async def status_of(session: aiohttp.ClientSession, path: str, **kwargs: Any) -> int:
    async with session.get(path, **kwargs) as response:
        await response.read()
        return response.status


async def test_scraping_needs_credentials_and_is_served_over_tls(pki: Pki) -> None:
    async with running_exporter(simulated(tls_auth_config(pki))) as exporter:
        url = f"https://127.0.0.1:{exporter.port}"
        connector = aiohttp.TCPConnector(ssl=pki.client_context())
        async with aiohttp.ClientSession(url, connector=connector) as session:
            async with session.get("/metrics") as response:
                assert response.status == 401, "no credentials must be refused"
                assert response.headers["WWW-Authenticate"].startswith('Basic realm="')
                assert response.headers["X-Content-Type-Options"] == "nosniff", (
                    "configured headers go on every response, refusals too"
                )
            wrong = basic(USER, "guess")
            assert await status_of(session, "/metrics", headers=wrong) == 401, "wrong password"
            stranger = basic("mallory", PASSWORD)
            assert await status_of(session, "/metrics", headers=stranger) == 401, "unknown user"
            async with session.get("/metrics", headers=GOOD) as response:
                assert response.status == 200
                assert "gpu_up" in await response.text()
            for probe in ("/healthz", "/readyz"):
                assert await status_of(session, probe) in (200, 503), (
                    f"{probe} must answer kubelet probes, which send no credentials"
                )
                assert await status_of(session, probe) != 401
            assert await status_of(session, "/", headers=GOOD) == 200
            assert await status_of(session, "/") == 401, "the landing page lists GPU UUIDs"
            await exporter.sampler.wait_for_rounds(Cadence.FAST, 1)  # the counter is rendered
            async with session.get("/metrics", headers=GOOD) as response:
                series = parse_exposition(await response.text())
            rejected = one(
                series, "gpu_exporter_http_requests_rejected_total", reason="unauthorized"
            )
            assert rejected == 4, "each refused request is counted once"
        async with aiohttp.ClientSession() as plain:
            with pytest.raises(aiohttp.ClientError):
                await status_of(plain, f"http://127.0.0.1:{exporter.port}/metrics")


async def test_health_endpoints_need_credentials_when_configured(pki: Pki) -> None:
    config = simulated(tls_auth_config(pki), web_auth_health=True)
    async with running_exporter(config) as exporter:
        connector = aiohttp.TCPConnector(ssl=pki.client_context())
        url = f"https://127.0.0.1:{exporter.port}"
        async with aiohttp.ClientSession(url, connector=connector) as session:
            assert await status_of(session, "/healthz") == 401
            assert await status_of(session, "/readyz") == 401
            assert await status_of(session, "/healthz", headers=GOOD) == 200


# -- the web server alone, over a stub sampler --------------------------------------------------


@dataclass
class StubSampler:
    """What the endpoints read from the sampler: a healthy, ready, empty exporter."""

    ready: bool = True

    def healthy(self) -> bool:
        return True

    def problems(self) -> list[str]:
        return []

    def note_read(self) -> None:
        pass

    @property
    def exposition(self) -> Any:
        from gpu_exporter.exposition import render

        return render(())

    async def read_exposition(self) -> Any:
        return self.exposition


class Gate:
    """A route whose requests wait until released, to hold request slots without sleeping."""

    def __init__(self, expected: int) -> None:
        self.entered = 0
        self.all_in = asyncio.Event()
        self.release = asyncio.Event()
        self.expected = expected

    async def handle(self, request: web.Request) -> web.Response:
        self.entered += 1
        if self.entered == self.expected:
            self.all_in.set()
        await self.release.wait()
        return web.Response(text="done\n")


@asynccontextmanager
async def serving(
    config: Config, guard: RequestGuard, routes: list[web.RouteDef] | None = None
) -> AsyncIterator[str]:
    app = make_web_app(StubSampler(), routes or [], guard)  # type: ignore[arg-type]
    server = await start_web_server(app, config, guard)
    try:
        scheme = "https" if config.web and config.web.tls else "http"
        yield f"{scheme}://127.0.0.1:{server.port}"
    finally:
        await server.stop()


def guard_for(config: Config) -> RequestGuard:
    return RequestGuard(
        config.web, max_requests=config.web_max_requests, auth_health=config.web_auth_health
    )


async def test_mutual_tls_refuses_a_client_without_a_certificate(pki: Pki) -> None:
    path = tls_auth_config(
        pki,
        "  client_auth_type: RequireAndVerifyClientCert\n"
        "  client_ca_file: ca.crt\n"
        "  client_allowed_sans: [scraper.example]\n",
    )
    config = make_config(web=load_web_config(path))
    async with serving(config, guard_for(config)) as url:
        anonymous = aiohttp.TCPConnector(ssl=pki.client_context())
        async with aiohttp.ClientSession(url, connector=anonymous) as session:
            with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
                await status_of(session, "/metrics", headers=GOOD)
        trusted = aiohttp.TCPConnector(ssl=pki.client_context("scraper.example"))
        async with aiohttp.ClientSession(url, connector=trusted) as session:
            assert await status_of(session, "/metrics", headers=GOOD) == 200
        other = aiohttp.TCPConnector(ssl=pki.client_context("intruder.example"))
        async with aiohttp.ClientSession(url, connector=other) as session:
            assert await status_of(session, "/metrics", headers=GOOD) == 403, (
                "a certificate from the CA but without an allowed SAN is refused"
            )


async def test_requests_beyond_max_requests_get_503_at_once_and_probes_still_answer() -> None:
    config = make_config(web_max_requests=2)
    guard = guard_for(config)
    gate = Gate(expected=2)
    async with (
        serving(config, guard, [web.get("/hold", gate.handle)]) as url,
        aiohttp.ClientSession(url) as session,
    ):
        held = [asyncio.create_task(status_of(session, "/hold")) for _ in range(2)]
        await asyncio.wait_for(gate.all_in.wait(), 5)
        assert await status_of(session, "/metrics") == 503, "a third request is refused"
        assert await status_of(session, "/healthz") == 200, "probes are never limited"
        gate.release.set()
        assert await asyncio.gather(*held) == [200, 200]
        assert await status_of(session, "/metrics") == 200, "slots are given back"
    assert guard.rejected["max_requests"] == 1


async def raw_exchange(url: str, request: bytes) -> tuple[bytes, float]:
    """Send ``request`` bytes and read until the server closes: (what came back, seconds)."""
    port = int(url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(request)
    await writer.drain()
    try:
        answer = await asyncio.wait_for(reader.read(), 5.0)  # a bound, not a wait
    finally:
        writer.close()
    return answer, time.monotonic() - started


async def test_oversized_or_malformed_requests_are_refused_counted_and_logged_on_one_line() -> None:
    config = make_config()
    guard = guard_for(config)
    async with serving(config, guard) as url:
        with capture_logs() as logs:
            huge_field = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"
            answer, _ = await raw_exchange(url, huge_field)
            assert answer.split(b" ", 2)[1] in (b"400", b"431"), answer[:80]
            many = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
            answer, _ = await raw_exchange(url, b"GET /metrics HTTP/1.1\r\n" + many + b"\r\n")
            assert answer.split(b" ", 2)[1] in (b"400", b"431"), answer[:80]
            answer, _ = await raw_exchange(url, b"\x16\x03\x01 not HTTP at all\r\n\r\n")
            assert answer.split(b" ", 2)[1] == b"400", answer[:80]
    assert guard.rejected["bad_request"] == 3, "every request the parser refuses is counted"
    refused = [entry for entry in logs if entry["event"] == "malformed request refused"]
    assert len(refused) == 1, f"one warning, the repeats rate-limited: {logs}"
    assert "exc_info" not in refused[0], "a client's malformed request is not a traceback"
    assert refused[0]["client"] == "127.0.0.1"


async def test_a_client_that_never_finishes_its_request_head_is_disconnected() -> None:
    config = make_config(web_read_timeout=0.5)
    async with serving(config, guard_for(config)) as url:
        answer, waited = await raw_exchange(url, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slo")
        assert answer == b"", "the half-sent request must get no answer, only a closed socket"
        assert 0.4 <= waited < 4.0, f"closed after {waited:.2f}s, expected about 0.5s"


def test_the_cli_refuses_a_bad_web_config_in_one_line(tmp_path: Path) -> None:
    path = write_web_config(
        tmp_path, "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_exporter",
            "--simulate",
            "--listen=127.0.0.1:0",
            f"--web.config.file={path}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got: {result.stderr}"
    assert lines[0] == (
        f"gpu-exporter: error: web config {path}: tls_server_config.cert_file: "
        f"cannot read {tmp_path / 'missing.crt'}: No such file or directory"
    )


def test_the_cli_refuses_a_web_config_linked_to_dev_zero_without_reading_it(
    tmp_path: Path,
) -> None:
    """Read whole, the link took gigabytes of RSS before any error: it is refused by fstat."""
    path = tmp_path / "web.yml"
    path.symlink_to("/dev/zero")
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "--simulate", f"--web.config.file={path}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"gpu-exporter: error: web config {path}: cannot read the file: "
        "not a regular file (a character device)"
    ]


async def test_a_handler_that_raises_is_a_500_and_one_structured_error() -> None:
    async def broken(_request: web.Request) -> web.Response:
        raise RuntimeError("a bug in a handler")

    config = make_config()
    guard = guard_for(config)
    async with serving(config, guard, [web.get("/broken", broken)]) as url:
        with capture_logs() as logs:
            async with aiohttp.ClientSession(url) as session:
                assert await status_of(session, "/broken") == 500
    (error,) = [entry for entry in logs if entry["log_level"] == "error"]
    assert isinstance(error["exc_info"], RuntimeError), "the traceback goes to the structured log"
    assert guard.rejected["bad_request"] == 0, "a server bug is not the client's bad request"


def head(host_lines: bytes, version: bytes = b"HTTP/1.1", path: bytes = b"/healthz") -> bytes:
    return b"GET " + path + b" " + version + b"\r\n" + host_lines + b"Connection: close\r\n\r\n"


@pytest.mark.parametrize(
    "request_head",
    [
        head(b""),  # HTTP/1.1 needs a Host (aiohttp's parser)
        head(b"Host: 127.0.0.1\r\nHost: 127.0.0.1\r\n"),  # two Host lines (aiohttp's parser)
        head(b"Host: a.example\r\nHost: b.example\r\n"),
        head(b"Host: evil.example@127.0.0.1\r\n"),  # the rest are values only the guard refuses
        head(b"Host: two words\r\n"),
        head(b"Host: /etc/passwd\r\n"),
        head(b"Host: \xe9t\xe9.example\r\n"),
        head(b"Host: [not-an-ipv6]:9445\r\n"),
        head(b"Host: 127.0.0.1:9445:1\r\n"),
        head(b"Host: two words\r\n", path=b"/status.json"),  # guarded paths too
        head(b"Host: two words\r\n", path=b"/metrics"),
        head(b"", path=b"/metrics"),
    ],
    ids=[
        "none",
        "twice-the-same",
        "two-different",
        "userinfo",
        "space",
        "path",
        "not-ascii",
        "bad-ip-literal",
        "two-ports",
        "status-page",
        "metrics",
        "metrics-none",
    ],
)
async def test_a_missing_repeated_or_invalid_host_is_answered_400_and_counted(
    request_head: bytes,
) -> None:
    """RFC 9112 3.2: no Host in HTTP/1.1, more than one, or one that is not host[:port] is a 400.
    The exporter uses Host for nothing, but a proxy or cache in front of it might; an ambiguous
    request is refused rather than answered one way here and read another way there."""
    config = make_config()
    guard = guard_for(config)
    async with serving(config, guard) as url:
        answer, _ = await raw_exchange(url, request_head)
    assert answer.split(b" ", 2)[1] == b"400", answer[:120]
    assert guard.rejected["bad_request"] == 1, "the refusal is counted like the parser's"


@pytest.mark.parametrize(
    "request_head",
    [
        head(b"Host: 127.0.0.1:9445\r\n"),
        head(b"Host: [::1]:9445\r\n"),
        head(b"Host: gpu-node-7.cluster.local\r\n"),
        head(b"Host: \r\n"),  # empty is allowed: a target without an authority
        head(b"", version=b"HTTP/1.0"),  # HTTP/1.0 needs no Host
        head(b"Host: 127.0.0.1:9445\r\n", path=b"/metrics"),
    ],
    ids=["ip-and-port", "ipv6-literal", "name", "empty", "http-1.0-without", "metrics"],
)
async def test_a_valid_host_or_none_in_http_1_0_is_served(request_head: bytes) -> None:
    config = make_config()
    guard = guard_for(config)
    async with serving(config, guard) as url:
        answer, _ = await raw_exchange(url, request_head)
    assert answer.split(b" ", 2)[1] == b"200", answer[:120]
    assert guard.rejected["bad_request"] == 0
