"""The status page and /status.json from a real exporter on the simulator, over loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path

import aiohttp
import jsonschema
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpu_exporter.app import Exporter, build_exporter
from gpu_exporter.cli import host_for
from gpu_exporter.collectors import Cadence
from gpu_exporter.config import SimulatorConfig
from gpu_exporter.http.webconfig import load_web_config
from tests.helpers import make_config, running_exporter, simulated_exporter
from tests.status.helpers import device, notebook_seen_idle, status_json
from tests.web_helpers import PASSWORD, USER, bcrypt_hash, write_web_config

SCHEMA = json.loads(resources.files("gpu_exporter").joinpath("data/status.schema.json").read_text())


@pytest.fixture
async def exporter() -> AsyncIterator[Exporter]:
    config = make_config(simulator=SimulatorConfig(), fast_interval=0.2, slow_interval=1.0)
    running = build_exporter(config, host_for(config))
    await running.start()
    try:
        await running.sampler.wait_for_rounds(Cadence.FAST, 2)  # GPM needs two samples
        yield running
    finally:
        await running.stop()


async def test_the_built_in_node_at_a_glance(exporter: Exporter) -> None:
    async with aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session:
        await notebook_seen_idle(exporter, session)
        document = await status_json(session)
        async with session.get("/") as response:
            assert response.content_type == "text/html"
            page = await response.text()
    jsonschema.validate(document, SCHEMA)
    kinds = [d["kind"] for d in document["devices"]]
    assert (kinds.count("gpu"), kinds.count("mig")) == (8, 4)
    shared = device(document, "4")
    assert [h["pod"] for h in shared["holders"]] == ["llm-serve-a", "llm-serve-b"]
    notebook = device(document, "5")
    assert [h["pod"] for h in notebook["holders"]] == ["jupyter-alice"]
    assert notebook["idle_allocated"], "the idle notebook's GPU is flagged"
    assert not device(document, "0")["idle_allocated"], "the training GPU is busy"
    assert device(document, "6")["mig_instances"] == 4
    assert page.count('data-kind="gpu"') == 8
    assert page.count('data-kind="mig"') == 4
    assert "allocated but idle" in page
    assert "research/jupyter-alice/notebook" in page


async def test_a_hardware_xid_shows_its_drain_and_its_row(exporter: Exporter) -> None:
    async with aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session:
        event = {"type": "xid", "gpu": 2, "code": 48}
        async with session.post("/-/simulator/events", json=event) as response:
            assert response.status == 200, await response.text()
        await exporter.sampler.wait_for_rounds(Cadence.FAST, 2)
        document = await status_json(session)
        async with session.get("/") as response:
            page = await response.text()
    gpu2 = device(document, "2")
    assert gpu2["health"]["drain_reasons"], "Xid 48 latches a drain recommendation"
    assert not gpu2["health"]["ok"]
    assert next((x["gpu"], x["xid"], x["xid_class"]) for x in document["xids"]) == (
        "2",
        "48",
        "hardware",
    )
    assert "drain:" in page
    assert '<tr class="xid hardware">' in page


async def test_refresh_is_a_meta_tag_and_bad_values_are_refused(exporter: Exporter) -> None:
    async with aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session:
        async with session.get("/?refresh=5") as response:
            assert '<meta http-equiv="refresh" content="5">' in await response.text()
        for bad in ("0", "1", "abc", "-5", "99999", "5.5"):
            async with session.get(f"/?refresh={bad}") as response:
                assert response.status == 400, f"refresh={bad} must be refused"
                assert "refresh" in await response.text()


async def test_the_page_costs_no_nvml_call() -> None:
    exporter, simulated = simulated_exporter(make_config(simulator=SimulatorConfig()))
    await exporter.sampler.start(background=False)
    try:
        await exporter.sampler.sample_round(Cadence.FAST)
        await exporter.sampler.sample_round(Cadence.SLOW)
        await exporter.sampler.sample_round(Cadence.FAST)
        # On a loaded machine a round may abandon a slow call that then finishes later: let every
        # call of the rounds return before counting, so only the page views are measured.
        assert await asyncio.to_thread(exporter.pool.wait_for_abandoned, 30.0)
        async with TestClient(TestServer(exporter.web_app)) as client:
            before = sum(simulated.node.calls.values())
            for path in ("/", "/?refresh=10", "/status.json", "/"):
                assert (await client.get(path)).status == 200
            assert sum(simulated.node.calls.values()) == before, "a page view called NVML"
    finally:
        await exporter.stop()


HOSTILE_SCENARIO = """
node: {name: hostile, driver_version: "580.95.05"}
gpus: [{model: H100-SXM-80GB, count: 1}]
workloads:
  - {gpu: 0, pod: "<script>alert(1)</script>", namespace: "x\\"><img src=x>", container: c,
     pid: 4242, memory: 1GiB, sm: 0.5}
allocations:
  - {gpu: 0, pod: "<script>alert(1)</script>", namespace: "x\\"><img src=x>", container: c}
"""


async def test_markup_from_a_scenario_renders_as_text(tmp_path: Path) -> None:
    scenario = tmp_path / "hostile.yaml"
    scenario.write_text(HOSTILE_SCENARIO)
    config = make_config(simulator=SimulatorConfig(scenario=scenario), fast_interval=0.2)
    exporter = build_exporter(config, host_for(config))
    await exporter.start()
    try:
        await exporter.sampler.wait_for_rounds(Cadence.FAST, 2)
        async with (
            aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session,
            session.get("/") as response,
        ):
            page = await response.text()
    finally:
        await exporter.stop()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, "the pod is shown, as text"
    assert "<script>" not in page
    assert "<img" not in page


async def test_the_page_and_its_json_sit_behind_the_web_config(tmp_path: Path) -> None:
    web_config = write_web_config(
        tmp_path, f"basic_auth_users:\n  {USER}: {bcrypt_hash(PASSWORD)}\n"
    )
    config = make_config(
        simulator=SimulatorConfig(), web_config_file=web_config, web=load_web_config(web_config)
    )
    credentials = {"Authorization": aiohttp.encode_basic_auth(USER, PASSWORD)}
    async with (
        running_exporter(config) as exporter,
        aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session,
    ):
        for path in ("/", "/status.json"):
            async with session.get(path) as response:
                assert response.status == 401, f"{path} lists pods and GPUs: it needs credentials"
            async with session.get(path, headers=credentials) as response:
                assert response.status == 200, f"{path} with credentials"


async def test_what_runs_on_a_gpu_without_holding_it_is_listed_under_it(
    exporter: Exporter,
) -> None:
    """The built-in node's GPU 7: a pod without a GPU request and a deleted pod's zombie."""
    assert exporter.allocation is not None
    async with aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session:
        while {p.process_class for p in exporter.allocation.processes} < {"not_held", "gone"}:
            await exporter.allocation.wait_for_poll()
        await exporter.sampler.wait_for_rounds(Cadence.FAST, 2)
        document = await status_json(session)
        async with session.get("/") as response:
            page = await response.text()
    jsonschema.validate(document, SCHEMA)
    free = device(document, "7")
    rows = {(p["process_class"], p["pod"], p["command"]) for p in free["processes"]}
    assert rows == {("not_held", "debug-shell", "python"), ("gone", "", "python3")}
    assert [(h["pod"], h["source"]) for h in free["holders"]] == [("debug-shell", "process")]
    assert '<span class="warn">gone</span> <code>python3</code>' in page
    assert "no allocation" in page, "the process holder is marked as such"
    assert not device(document, "5")["processes"], "the notebook holds its GPU"
