"""HTTP endpoints: ``/metrics`` from cached bytes, ``/healthz``, ``/readyz``, and the node status
page (``/``, ``/status.json``) built from the same render."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiohttp import web

from .. import __version__
from ..exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Exposition,
    accepts_gzip,
    wants_openmetrics,
)
from ..sampler import Sampler
from .gzipped import GzipBodies
from .status import StatusPage, UnheldProcess
from .webguard import RequestGuard

SAMPLER_KEY: web.AppKey[Sampler] = web.AppKey("sampler", Sampler)
STATUS_KEY: web.AppKey[StatusPage] = web.AppKey("status", StatusPage)
GZIP_KEY: web.AppKey[GzipBodies] = web.AppKey("gzip", GzipBodies)
GUARD_KEY: web.AppKey[RequestGuard] = web.AppKey("guard", RequestGuard)
# ?refresh=N on the status page: a person watching a node, not a poller (that is /status.json).
MIN_REFRESH_SECONDS = 2
MAX_REFRESH_SECONDS = 3600
# Request heads are a few hundred bytes (Prometheus sends ~6 headers); aiohttp answers a longer
# line or field with 400 and more headers with 400 before any handler runs.
MAX_LINE_BYTES = 8190
MAX_FIELD_BYTES = 8190
MAX_HEADERS = 64


def make_web_app(
    sampler: Sampler,
    extra_routes: Iterable[web.RouteDef] = (),
    guard: RequestGuard | None = None,
    processes: Callable[[], Mapping[str, tuple[UnheldProcess, ...]]] | None = None,
) -> web.Application:
    # No request has a body worth more than a simulator event: 64 KiB bounds what is buffered.
    app = web.Application(client_max_size=64 * 1024)
    if guard is not None:
        guard.install(app)
        app[GUARD_KEY] = guard
    app[SAMPLER_KEY] = sampler
    app[STATUS_KEY] = StatusPage(sampler, __version__, processes)
    app[GZIP_KEY] = GzipBodies()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", status_page)
    app.router.add_get("/status.json", status_json)
    app.router.add_routes(list(extra_routes))
    return app


def server_settings(read_timeout: float) -> dict[str, Any]:
    """aiohttp server limits: bounded request heads, and no connection kept past ``read_timeout``
    without a complete request head (aiohttp's keep-alive timer runs from the connection's start
    and from each response, and closes a connection whose request has not fully arrived)."""
    return {
        "keepalive_timeout": read_timeout,
        "max_line_size": MAX_LINE_BYTES,
        "max_field_size": MAX_FIELD_BYTES,
        "max_headers": MAX_HEADERS,
    }


async def metrics(request: web.Request) -> web.Response:
    """Serve the last render's bytes: no NVML call, no encoding on the loop (its gzip body is
    built once per render, on a thread: gzipped.py)."""
    sampler = request.app[SAMPLER_KEY]
    sampler.note_read()  # scrapers are reading: the next rounds render ahead of them
    exposition = await sampler.read_exposition()
    openmetrics = wants_openmetrics(request.headers.get("Accept", ""))
    gzipped = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    headers = {"Content-Type": OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    headers["Vary"] = "Accept, Accept-Encoding"
    if gzipped:
        body = await _gzip_body(request, exposition, openmetrics)
    else:
        body = exposition.body(openmetrics=openmetrics, gzipped=False)
    return web.Response(body=body, headers=headers)


async def _gzip_body(request: web.Request, exposition: Exposition, openmetrics: bool) -> bytes:
    """This render's gzip body, built once for every scrape waiting on it; the wait holds no
    request slot (``RequestGuard.slot_given_back``)."""
    build = request.app[GZIP_KEY].body(exposition, openmetrics=openmetrics)
    guard = request.app.get(GUARD_KEY)
    if guard is None:
        return await build
    with guard.slot_given_back():
        return await build


async def healthz(request: web.Request) -> web.Response:
    """200 while the sampler runs, listing what is degraded (a lost GPU, a hung NVML call): a
    restart would not fix a stuck driver, so only a stalled sampler fails the probe."""
    sampler = request.app[SAMPLER_KEY]
    if not sampler.healthy():
        return web.Response(status=503, text="sampler stalled\n")
    degraded = "".join(f"degraded: {problem}\n" for problem in sampler.problems())
    return web.Response(text=f"ok\n{degraded}")


async def readyz(request: web.Request) -> web.Response:
    if request.app[SAMPLER_KEY].ready:
        return web.Response(text="ready\n")
    return web.Response(status=503, text="first sample not complete\n")


async def status_page(request: web.Request) -> web.Response:
    """The node at a glance, from the last render: no NVML call (docs/status.md)."""
    raw = request.query.get("refresh")
    refresh = None
    if raw is not None:
        if not raw.isdigit() or not MIN_REFRESH_SECONDS <= int(raw) <= MAX_REFRESH_SECONDS:
            return web.Response(
                status=400,
                text=f"refresh: want whole seconds from {MIN_REFRESH_SECONDS} to "
                f"{MAX_REFRESH_SECONDS}, got {raw[:20]!r}\n",
            )
        refresh = int(raw)
    request.app[SAMPLER_KEY].note_read()
    body = request.app[STATUS_KEY].html(refresh)
    return web.Response(body=body, content_type="text/html", charset="utf-8")


async def status_json(request: web.Request) -> web.Response:
    """The status page's data for scripts (schema: ``gpu_exporter/data/status.schema.json``)."""
    request.app[SAMPLER_KEY].note_read()
    body = request.app[STATUS_KEY].json()
    return web.Response(body=body, content_type="application/json", charset="utf-8")
