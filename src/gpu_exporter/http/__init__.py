"""The HTTP surface (edge): everything a client on the network reaches, and nothing else.

- ``listener.py``: aiohttp's server on the listening socket, over TLS when configured.
- ``server.py``: the aiohttp application: ``/metrics`` from the sampler's cached bytes,
  ``/healthz``, ``/readyz``, the landing page; server settings (timeouts, keep-alive).
- ``webguard.py``: what a request passes first: concurrency and rate limits, client-certificate
  SANs, basic auth, body and write timeouts; rejection counters; aiohttp's server log into the
  structured log.
- ``webconfig.py``: the exporter-toolkit web config file (``--web.config.file``) parsed into a
  frozen :class:`~gpu_exporter.websecurity.WebConfig`.
- ``webreload.py``: follows that file while running (certificates, users) and swaps it in.
- ``admin.py``: the opt-in admin API (``--web.enable-admin-api``).

A new endpoint is a route: add it in ``server.make_web_app`` (always served) or as its own
module returning ``web.RouteDef``s that ``app.build_exporter`` passes in (opt-in, like
``admin_routes``); every route goes through the guard. This package may import the core
(exposition, sampler, logs, xid state) but the core never imports it; ``config.py`` imports only
``webconfig`` (a leaf: it imports nothing of ours). Import the submodules directly: this
``__init__`` re-exports nothing, so importing the config does not pull in the server.
"""
