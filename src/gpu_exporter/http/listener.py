"""The listening socket: aiohttp's server on ``--listen``, over TLS when the web config has a
certificate. Every request, ``/metrics`` included, is answered by the app ``server.py`` builds."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from ..logs import get_logger
from ..websecurity import WebConfig
from .server import server_settings
from .webguard import RequestGuard, ServerLog

_log = get_logger("app")


class ListenError(OSError):
    """The web server could not bind ``--listen`` (in use, no permission, no such address)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class WebServer:
    """A listening exporter: aiohttp's runner and its one site."""

    runner: web.AppRunner

    @property
    def port(self) -> int:
        return int(self.runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop listening and close the connections (requests in progress may finish)."""
        await self.runner.cleanup()


async def listen(
    web_app: web.Application,
    guard: RequestGuard,
    address: tuple[str, int],
    web_config: WebConfig | None,
    *,
    read_timeout: float,
) -> WebServer:
    """Serve ``web_app`` on ``address``, over TLS when the web config has a certificate."""
    host, port = address
    runner = web.AppRunner(
        web_app,
        access_log=None,
        handle_signals=False,
        logger=ServerLog(guard),
        **server_settings(read_timeout),
    )
    await runner.setup()
    tls = web_config.tls if web_config else None
    site = web.TCPSite(runner, host, port, ssl_context=tls.context if tls else None)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ListenError(exc.strerror or str(exc)) from exc
    except BaseException:
        await runner.cleanup()
        raise
    server = WebServer(runner)
    _log.info(
        "listening",
        address=f"{host}:{server.port}",
        tls=tls is not None,
        client_auth=tls.client_auth if tls else "NoClientCert",
        basic_auth=bool(web_config and web_config.auth_required),
    )
    return server
