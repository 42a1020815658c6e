"""The listening socket: every connection starts on the scrape fast path (``fastpath.py``), and
aiohttp's server takes those that ask for anything else."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from ..logs import get_logger
from .fastpath import FastPath
from .server import GZIP_KEY, SAMPLER_KEY, server_settings
from .webconfig import WebConfig
from .webguard import RequestGuard, ServerLog

_log = get_logger("app")


class ListenError(OSError):
    """The web server could not bind ``--listen`` (in use, no permission, no such address)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class WebServer:
    """A listening exporter: the socket, the fast path and aiohttp's runner behind it."""

    runner: web.AppRunner
    fast_path: FastPath
    server: asyncio.Server

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening, close the fast path's connections, then aiohttp's (its shutdown
        lets requests in progress finish)."""
        self.server.close()
        self.fast_path.close_all()
        await self.runner.cleanup()


async def listen(
    web_app: web.Application,
    guard: RequestGuard,
    address: tuple[str, int],
    web_config: WebConfig | None,
    *,
    read_timeout: float,
    write_timeout: float,
) -> WebServer:
    """Serve ``web_app`` on ``address``, over TLS when the web config has a certificate."""
    host, port = address
    settings = server_settings(read_timeout)
    runner = web.AppRunner(
        web_app, access_log=None, handle_signals=False, logger=ServerLog(guard), **settings
    )
    await runner.setup()
    assert runner.server is not None  # set up above
    fast_path = FastPath(
        web_app[SAMPLER_KEY],
        guard,
        web_app[GZIP_KEY],
        runner.server,
        read_timeout=read_timeout,
        write_timeout=write_timeout,
    )
    tls = web_config.tls if web_config else None
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(
            fast_path.connection,
            host,
            port,
            ssl=tls.context if tls else None,
        )
    except OSError as exc:
        await runner.cleanup()
        raise ListenError(exc.strerror or str(exc)) from exc
    except BaseException:
        await runner.cleanup()
        raise
    _log.info(
        "listening",
        address=f"{host}:{server.sockets[0].getsockname()[1]}",
        tls=tls is not None,
        client_auth=tls.client_auth if tls else "NoClientCert",
        basic_auth=bool(web_config and web_config.auth_required),
    )
    return WebServer(runner, fast_path, server)
