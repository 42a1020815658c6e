"""HTTP endpoints: ``/metrics`` from cached bytes, ``/healthz``, ``/readyz`` and a landing page."""

from __future__ import annotations

import html
from collections.abc import Iterable

from aiohttp import web

from . import __version__
from .exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, wants_openmetrics
from .sampler import Sampler

SAMPLER_KEY: web.AppKey[Sampler] = web.AppKey("sampler", Sampler)


def make_web_app(sampler: Sampler, extra_routes: Iterable[web.RouteDef] = ()) -> web.Application:
    app = web.Application()
    app[SAMPLER_KEY] = sampler
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", landing)
    app.router.add_routes(list(extra_routes))
    return app


async def metrics(request: web.Request) -> web.Response:
    """Serve the last render: no NVML call, no encoding work beyond a cached gzip."""
    exposition = request.app[SAMPLER_KEY].exposition
    openmetrics = wants_openmetrics(request.headers.get("Accept", ""))
    gzipped = "gzip" in request.headers.get("Accept-Encoding", "")
    headers = {"Content-Type": OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    headers["Vary"] = "Accept, Accept-Encoding"
    body = exposition.body(openmetrics=openmetrics, gzipped=gzipped)
    return web.Response(body=body, headers=headers)


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


async def landing(request: web.Request) -> web.Response:
    sampler = request.app[SAMPLER_KEY]
    system = sampler.system
    rows = "".join(
        f"<tr><td>{device.id.index}</td><td>{html.escape(device.uuid)}</td>"
        f"<td>{html.escape(device.id.mig_profile or device.id.model)}</td></tr>"
        for device in sampler.devices()
    )
    driver = html.escape(system.driver_version) if system else "unknown"
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>gpu-exporter</title></head>
<body><h1>gpu-exporter {html.escape(__version__)}</h1>
<p>Driver {driver}. Ready: {"yes" if sampler.ready else "no"}.</p>
<p><a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> ·
<a href="/readyz">/readyz</a></p>
<table><tr><th>gpu</th><th>uuid</th><th>model / MIG profile</th></tr>{rows}</table>
</body></html>
"""
    return web.Response(text=page, content_type="text/html")
