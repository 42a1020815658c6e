"""HTTP control surface of a running simulated exporter (mounted only under ``--simulate``).

``POST /-/simulator/events`` takes one event or a list (JSON or YAML; the timeline schema without
``at``/``repeat``), applies them now and answers 200 with a JSON echo, or 400 with the one-line
ScenarioError text. ``GET /-/simulator/scenario`` answers the current state as JSON.

Only loopback clients may inject (403 otherwise) unless ``remote``: the exporter listens on every
interface by default, and anyone on the pod network could otherwise fake faults. Bodies are
UTF-8, at most the application's ``client_max_size`` (64 KiB); a YAML body may not use aliases
(a 1 KiB alias bomb expanded to gigabytes in the echo).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpu_exporter.bodies import BadBody, parse_json, read_text
from gpu_exporter.simulator.errors import ScenarioError
from gpu_exporter.simulator.loader import load_yaml
from gpu_exporter.simulator.summary import current_summary

if TYPE_CHECKING:
    from gpu_exporter.simulator.node import SimulatedNode

EVENTS_PATH = "/-/simulator/events"
SCENARIO_PATH = "/-/simulator/scenario"
REQUEST_SOURCE = "<request>"
REMOTE_REFUSED = (
    "simulator events are accepted from loopback only (start with --simulate.remote-events to "
    "accept them from anywhere)\n"
)


def make_routes(node: SimulatedNode, *, remote: bool = False) -> list[web.RouteDef]:
    """Routes to add to the exporter's aiohttp application (``remote``: accept events from any
    address, not only loopback)."""

    async def post_events(request: web.Request) -> web.Response:
        if not remote and not _loopback(request.remote):
            return web.Response(status=403, text=REMOTE_REFUSED)
        try:
            body = await read_text(request)
            data = _parse_body(body, request.content_type)
            # Applying takes the node lock that NVML worker threads hold: keep it off the loop.
            applied = await asyncio.to_thread(node.inject_many, data, REQUEST_SOURCE)
        except BadBody as exc:
            return web.Response(status=400, text=f"{REQUEST_SOURCE}: (body): {exc}\n")
        except ScenarioError as exc:
            return web.Response(status=400, text=str(exc) + "\n")
        return web.json_response({"applied": applied}, dumps=_dumps)

    async def get_scenario(request: web.Request) -> web.Response:
        summary = await asyncio.to_thread(current_summary, node)
        return web.json_response(summary, dumps=_dumps)

    return [web.post(EVENTS_PATH, post_events), web.get(SCENARIO_PATH, get_scenario)]


def _parse_body(body: str, content_type: str) -> Any:
    if not body.strip():
        raise ScenarioError(REQUEST_SOURCE, "(body)", "empty request body: send an event")
    if content_type == "application/json":
        try:
            return parse_json(body)
        except BadBody as exc:
            raise ScenarioError(REQUEST_SOURCE, "(json)", str(exc)) from None
    return load_yaml(body, REQUEST_SOURCE, aliases=False)


def _loopback(address: str | None) -> bool:
    if address is None:
        return False
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a dual-stack socket's IPv4 client
    return ip.is_loopback


def _dumps(value: Any) -> str:
    # YAML bodies can carry dates and the like; echo them as strings rather than failing.
    return json.dumps(value, default=str)
