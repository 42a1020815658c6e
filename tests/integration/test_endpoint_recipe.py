"""docs/design.md's "Adding an endpoint" recipe, followed by a trivial opt-in endpoint: a running
exporter serves it beside its own routes, behind the web config's credentials as ``/metrics``
is, and a body it cannot read is a 400 that says why."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gpu_exporter.app import Exporter, build_exporter
from gpu_exporter.bodies import BadBody, parse_json, read_text
from gpu_exporter.collectors import Cadence
from gpu_exporter.config import SimulatorConfig
from gpu_exporter.http.server import SAMPLER_KEY
from gpu_exporter.http.webconfig import load_web_config
from gpu_exporter.simulator.host import simulated_host
from tests.helpers import make_config, started
from tests.web_helpers import PASSWORD, USER, bcrypt_hash, write_web_config

CREDENTIALS = {"Authorization": aiohttp.encode_basic_auth(USER, PASSWORD)}
SCENARIO = "gpus: [{model: H100-SXM-80GB, count: 2}]\n"


# Step 1: an opt-in module's function takes the parts it uses and returns routes; the handler
# reads what the sampler holds, and a body through bodies.py.
def recipe_routes(greeting: str) -> list[web.RouteDef]:
    async def gpus(request: web.Request) -> web.Response:
        system = request.app[SAMPLER_KEY].system
        return web.json_response({"gpus": None if system is None else system.gpu_count})

    async def greet(request: web.Request) -> web.Response:
        try:
            body = parse_json(await read_text(request))
        except BadBody as exc:
            return web.Response(status=400, text=f"{exc}\n")
        return web.json_response({"greeting": f"{greeting}, {body.get('name', 'nobody')}"})

    return [web.get("/-/recipe/gpus", gpus), web.post("/-/recipe/greet", greet)]


@pytest.fixture
async def exporter(tmp_path: Path) -> AsyncIterator[Exporter]:
    scenario = tmp_path / "node.yaml"
    scenario.write_text(SCENARIO)
    web_config = write_web_config(
        tmp_path, f"basic_auth_users:\n  {USER}: {bcrypt_hash(PASSWORD)}\n"
    )
    config = make_config(
        simulator=SimulatorConfig(scenario),
        web_config_file=web_config,
        web=load_web_config(web_config),
        allocation=False,
        kmsg_path=tmp_path / "kmsg",
        state_dir=tmp_path / "state",
    )
    # Step 2: build_exporter adds an opt-in module's routes to the list make_web_app serves
    # beside its own when the switch is on; the host's routes are in that same list, which is
    # where a test puts them without a switch of their own.
    simulated = simulated_host(config)
    host = replace(simulated.host, routes=(*simulated.host.routes, *recipe_routes("hello")))
    async with started(build_exporter(config, host)) as running:
        await running.sampler.wait_for_rounds(Cadence.FAST, 1)
        yield running


async def test_the_new_endpoint_is_served_with_what_the_sampler_holds(exporter: Exporter) -> None:
    async with (
        aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session,
        session.get("/-/recipe/gpus", headers=CREDENTIALS) as response,
    ):
        assert response.status == 200, await response.text()
        assert await response.json() == {"gpus": 2}


async def test_the_new_endpoint_takes_the_credentials_metrics_takes(exporter: Exporter) -> None:
    async with aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session:
        for path in ("/metrics", "/-/recipe/gpus"):
            async with session.get(path) as response:
                assert response.status == 401, f"{path} without credentials: {response.status}"
        async with session.post("/-/recipe/greet", json={"name": "operator"}) as response:
            assert response.status == 401, "a POST route is guarded as well"


async def test_a_body_the_endpoint_cannot_read_is_refused_with_why(exporter: Exporter) -> None:
    async with aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session:
        async with session.post(
            "/-/recipe/greet", json={"name": "operator"}, headers=CREDENTIALS
        ) as response:
            assert response.status == 200, await response.text()
            assert await response.json() == {"greeting": "hello, operator"}
        async with session.post(
            "/-/recipe/greet",
            data=b'{"name": "\xff"}',
            headers={**CREDENTIALS, "Content-Type": "application/json"},
        ) as response:
            assert response.status == 400
            assert "not UTF-8" in await response.text()
