"""HTTP control surface of a running simulated exporter (mounted only under ``--simulate``).

``POST /-/simulator/events`` takes one event or a list (JSON or YAML; the timeline schema without
``at``/``repeat``), applies them now and answers 200 with a JSON echo, or 400 with the one-line
ScenarioError text. ``GET /-/simulator/scenario`` answers the current state as JSON.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpu_exporter.simulator.errors import ScenarioError
from gpu_exporter.simulator.loader import load_yaml

if TYPE_CHECKING:
    from gpu_exporter.simulator.node import SimulatedNode

EVENTS_PATH = "/-/simulator/events"
SCENARIO_PATH = "/-/simulator/scenario"
REQUEST_SOURCE = "<request>"


def make_routes(node: SimulatedNode) -> list[web.RouteDef]:
    """Routes to add to the exporter's aiohttp application."""

    async def post_events(request: web.Request) -> web.Response:
        body = await request.text()
        try:
            data = _parse_body(body, request.content_type)
            # Applying takes the node lock that NVML worker threads hold: keep it off the loop.
            applied = await asyncio.to_thread(node.inject_many, data, REQUEST_SOURCE)
        except ScenarioError as exc:
            return web.Response(status=400, text=str(exc) + "\n")
        return web.json_response({"applied": applied}, dumps=_dumps)

    async def get_scenario(request: web.Request) -> web.Response:
        summary = await asyncio.to_thread(node.summary)
        return web.json_response(summary, dumps=_dumps)

    return [web.post(EVENTS_PATH, post_events), web.get(SCENARIO_PATH, get_scenario)]


def _parse_body(body: str, content_type: str) -> Any:
    if not body.strip():
        raise ScenarioError(REQUEST_SOURCE, "(body)", "empty request body: send an event")
    if content_type == "application/json":
        try:
            return json.loads(body)
        except json.JSONDecodeError as exc:
            raise ScenarioError(REQUEST_SOURCE, "(json)", exc.msg) from None
    return load_yaml(body, REQUEST_SOURCE)


def _dumps(value: Any) -> str:
    # YAML bodies can carry dates and the like; echo them as strings rather than failing.
    return json.dumps(value, default=str)
