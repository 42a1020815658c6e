"""The HTTP endpoints of an exporter on the simulator, through a real server on loopback."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gpu_exporter import __version__
from gpu_exporter.app import Exporter, build_exporter
from gpu_exporter.cli import host_for
from gpu_exporter.collectors import Cadence
from gpu_exporter.config import SimulatorConfig
from gpu_exporter.exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE
from gpu_exporter.simulator.host import SimulatedHost
from tests.conftest import promtool_check_metrics
from tests.helpers import make_config, one, parse_exposition, simulated_exporter

SPEC_FAMILIES = {
    "gpu_info",
    "gpu_mig_info",
    "gpu_up",
    "gpu_exporter_build_info",
    "gpu_sm_active_seconds_total",
    "gpu_tensor_active_seconds_total",
    "gpu_dram_active_seconds_total",
    "gpu_utilization_seconds_total",
    "gpu_memory_total_bytes",
    "gpu_memory_used_bytes",
    "gpu_memory_reserved_bytes",
    "gpu_power_limit_watts",
    "gpu_energy_joules_total",
    "gpu_temperature_celsius",
    "gpu_clock_hertz",
    "gpu_clocks_event_seconds_total",
    "gpu_ecc_errors_total",
    "gpu_remapped_rows_total",
    "gpu_row_remap_pending",
    "gpu_row_remap_failed",
    "gpu_row_remap_banks",
    "gpu_recovery_action",
    "gpu_exporter_collector_success",
    "gpu_exporter_source_up",
    "gpu_exporter_sample_age_seconds",
}
# Read by the status page, not served: their counter twins say it (docs/migration.md).
SECONDS = "gpu_clocks_event_seconds_total"
NOT_SERVED = {
    "gpu_sm_active_ratio",
    "gpu_tensor_active_ratio",
    "gpu_utilization_ratio",
    "gpu_clocks_event_active",
    "gpu_power_watts",
    "gpu_container_sm_active_ratio",
}
# gpu_exporter_nvml_errors_total{function,error} has series only once an error happened
# (see tests/core/test_faults.py).


@pytest.fixture
async def simulation() -> AsyncIterator[tuple[Exporter, SimulatedHost]]:
    config = make_config(simulator=SimulatorConfig(), fast_interval=0.2, slow_interval=1.0)
    running, simulated = simulated_exporter(config)
    await running.start()
    try:
        await running.sampler.wait_for_rounds(Cadence.FAST, 2)  # GPM needs two samples
        yield running, simulated
    finally:
        await running.stop()


@pytest.fixture
def exporter(simulation: tuple[Exporter, SimulatedHost]) -> Exporter:
    return simulation[0]


@pytest.fixture
async def client(exporter: Exporter) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session:
        yield session


async def fetch_metrics(client: aiohttp.ClientSession, **headers: str) -> str:
    async with client.get("/metrics", headers=headers) as response:
        assert response.status == 200
        return await response.text()


async def test_metrics_serves_every_spec_family_in_the_text_format(
    client: aiohttp.ClientSession, exporter: Exporter
) -> None:
    async with client.get("/metrics") as response:
        assert response.headers["Content-Type"] == TEXT_CONTENT_TYPE
        body = await response.text()
    names = {name for name, _ in parse_exposition(body)}
    missing = SPEC_FAMILIES - names
    assert not missing, f"families missing from the built-in scenario: {sorted(missing)}"
    assert not names & NOT_SERVED, "families for the status page only were served"


async def test_promtool_finds_nothing_to_complain_about(client: aiohttp.ClientSession) -> None:
    body = await fetch_metrics(client)
    await asyncio.to_thread(promtool_check_metrics, body)


async def test_openmetrics_is_served_when_prometheus_asks_for_it(
    client: aiohttp.ClientSession,
) -> None:
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    async with client.get("/metrics", headers={"Accept": accept}) as response:
        assert response.headers["Content-Type"] == OPENMETRICS_CONTENT_TYPE
        body = await response.text()
    assert body.endswith("# EOF\n")
    assert "# TYPE gpu_energy_joules counter" in body


async def test_gzip_is_served_when_asked(exporter: Exporter) -> None:
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    async with (
        aiohttp.ClientSession(auto_decompress=False) as raw,
        raw.get(url, headers={"Accept-Encoding": "gzip"}) as response,
    ):
        assert response.headers["Content-Encoding"] == "gzip"
        body = gzip.decompress(await response.read()).decode()
    assert "gpu_info{" in body


async def test_gzip_refused_by_weight_is_not_sent(exporter: Exporter) -> None:
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    async with (
        aiohttp.ClientSession(auto_decompress=False) as raw,
        raw.get(url, headers={"Accept-Encoding": "gzip;q=0, identity"}) as response,
    ):
        assert "Content-Encoding" not in response.headers, "gzip was sent though refused"
        assert "gpu_info{" in (await response.read()).decode()


async def test_health_readiness_and_landing_page(client: aiohttp.ClientSession) -> None:
    async with client.get("/healthz") as response:
        assert response.status == 200
    async with client.get("/readyz") as response:
        assert response.status == 200
    async with client.get("/") as response:
        page = await response.text()
    assert __version__ in page
    assert page.count('data-kind="gpu"') == 8, "the status page has a row per GPU"
    assert "3g.40gb" in page


async def test_readyz_waits_for_the_first_fast_and_slow_rounds() -> None:
    config = make_config(simulator=SimulatorConfig())
    exporter = build_exporter(config, host_for(config))
    await exporter.sampler.start(background=False)
    try:
        from aiohttp.test_utils import TestClient, TestServer

        async with TestClient(TestServer(exporter.web_app)) as client:
            assert (await client.get("/readyz")).status == 503
            await exporter.sampler.sample_round(Cadence.FAST)
            assert (await client.get("/readyz")).status == 503
            await exporter.sampler.sample_round(Cadence.SLOW)
            assert (await client.get("/readyz")).status == 200
            # No sampling loop runs here: /healthz reports the sampler as not alive.
            assert (await client.get("/healthz")).status == 503
    finally:
        await exporter.stop()


async def test_injected_events_reach_the_metrics(
    client: aiohttp.ClientSession, exporter: Exporter
) -> None:
    event = {"type": "throttle", "gpu": 3, "reason": "hw_thermal_slowdown"}
    async with client.post("/-/simulator/events", json=event) as response:
        assert response.status == 200, await response.text()
    throttled = {"gpu": "3", "reason": "hw_thermal_slowdown"}
    await exporter.sampler.wait_for_rounds(Cadence.FAST, 2)
    before = one(parse_exposition(await fetch_metrics(client)), SECONDS, **throttled)
    await exporter.sampler.wait_for_rounds(Cadence.FAST, 2)
    after = one(parse_exposition(await fetch_metrics(client)), SECONDS, **throttled)
    assert after > before, "the throttle reason's time grows while it holds clocks down"


async def test_bad_injected_events_are_rejected_with_the_reason(
    client: aiohttp.ClientSession,
) -> None:
    async with client.post("/-/simulator/events", json={"type": "gpu_lost", "gpu": 99}) as response:
        assert response.status == 400
        assert "gpu" in await response.text()


async def test_a_hung_nvml_call_does_not_hold_up_scrapes(
    client: aiohttp.ClientSession, simulation: tuple[Exporter, SimulatedHost]
) -> None:
    exporter, simulated = simulation
    hang = {"type": "hang", "gpu": 1, "function": "nvmlDeviceGetPowerUsage"}
    async with client.post("/-/simulator/events", json=hang) as response:
        assert response.status == 200
    await exporter.sampler.wait_for_rounds(Cadence.FAST, 3)
    series = parse_exposition(await fetch_metrics(client))
    # The scrape answered while the call is still stuck in the (simulated) driver.
    assert simulated.node.hang_for("nvmlDeviceGetPowerUsage", 1) is not None
    assert one(series, "gpu_exporter_collector_success", collector="power") == 0
    assert one(series, "gpu_exporter_collector_success", collector="memory") == 1
    await client.post("/-/simulator/events", json={"type": "unhang"})


async def test_without_simulate_there_is_no_control_endpoint(exporter: Exporter) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from gpu_exporter.http.server import make_web_app

    async with TestClient(TestServer(make_web_app(exporter.sampler))) as client:
        response = await client.post("/-/simulator/events", json={"type": "unhang"})
        assert response.status in (404, 405)
