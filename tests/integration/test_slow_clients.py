"""Clients that hold connections without taking part: responses nobody reads, request bodies
that never finish, connections reset mid-answer. None of them may keep others from /metrics,
keep the health probes from telling the truth, or flood the log."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from structlog.testing import capture_logs

from gpu_exporter.config import Config, SimulatorConfig
from gpu_exporter.http.admin import DRAIN_CLEAR_PATH
from tests.helpers import make_config, one, parse_exposition, running_exporter

HOGS = 40  # as many as --web.max-requests' default


def simulated(tmp_path: Path, **overrides: Any) -> Config:
    return make_config(
        simulator=SimulatorConfig(),
        fast_interval=0.2,
        slow_interval=1.0,
        kmsg_path=tmp_path / "kmsg",
        state_dir=tmp_path / "state",
        **overrides,
    )


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills after a few KiB
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


@asynccontextmanager
async def hogs(port: int, request: bytes, count: int = HOGS) -> AsyncIterator[None]:
    """``count`` connections that send ``request`` and never read a byte."""
    writers = []
    try:
        for _ in range(count):
            _reader, writer = await connect(port)
            writer.write(request)
            writers.append(writer)
        yield
    finally:
        for writer in writers:
            writer.transport.abort()


async def metrics(session: aiohttp.ClientSession) -> tuple[int, str]:
    async with session.get("/metrics", headers={"Accept-Encoding": "identity"}) as response:
        return response.status, await response.text()


async def dropped(session: aiohttp.ClientSession, reason: str, at_least: int) -> None:
    """Scrape until the exporter has dropped ``at_least`` connections for ``reason``; every
    scrape meanwhile must succeed, and so must the liveness probe."""
    for _ in range(400):
        status, text = await metrics(session)
        assert status == 200, f"/metrics answered {status} while clients held connections"
        async with session.get("/healthz") as health:
            assert health.status == 200
        series = parse_exposition(text)
        if one(series, "gpu_exporter_http_connections_dropped_total", reason=reason) >= at_least:
            return
        await asyncio.sleep(0.05)  # the drops come at the timeout: nothing to await but time
    raise AssertionError(f"fewer than {at_least} connections dropped for {reason}")


async def test_responses_nobody_reads_do_not_hold_metrics(tmp_path: Path) -> None:
    pipelined = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 300  # megabytes of answers
    async with (
        running_exporter(simulated(tmp_path, web_write_timeout=1.0)) as exporter,
        aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session,
        hogs(exporter.port, pipelined),
    ):
        await dropped(session, "write_timeout", HOGS)


async def test_bodies_that_never_arrive_do_not_hold_metrics(tmp_path: Path) -> None:
    head = (
        f"POST {DRAIN_CLEAR_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n{"
    ).encode()
    config = simulated(tmp_path, web_enable_admin_api=True, web_read_timeout=1.0)
    async with (
        running_exporter(config) as exporter,
        aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session,
        hogs(exporter.port, head),
    ):
        await dropped(session, "body_timeout", HOGS)


def reset_after(request: bytes, port: int) -> None:
    """Send ``request``, then reset the connection (SO_LINGER 0) without reading."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.sendall(request)


async def test_connection_resets_are_counted_in_a_line_not_a_traceback_each(
    tmp_path: Path,
) -> None:
    pipelined = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 20
    async with (
        running_exporter(simulated(tmp_path)) as exporter,
        aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session,
    ):
        with capture_logs() as logs:
            for _ in range(200):
                await asyncio.to_thread(reset_after, pipelined, exporter.port)
            for _ in range(400):  # until the exporter has seen them
                _status, text = await metrics(session)
                series = parse_exposition(text)
                if one(series, "gpu_exporter_http_connections_dropped_total", reason="reset"):
                    break
                await asyncio.sleep(0.05)
        resets = one(series, "gpu_exporter_http_connections_dropped_total", reason="reset")
        assert resets >= 1, "no reset was seen: the test did not reproduce one"
        errors = [entry for entry in logs if entry["log_level"] == "error"]
        assert errors == [], f"{len(errors)} error lines, e.g. {errors[:1]}"
        lines = [entry for entry in logs if entry.get("reason") == "reset"]
        assert len(lines) <= 2, f"{len(lines)} lines for {resets:.0f} resets"
