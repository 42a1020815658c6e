"""The admin API (--web.enable-admin-api): an operator clears a drain recommendation over HTTP;
off by default, JSON only, behind the web config's credentials like /metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from gpu_exporter.app import Exporter
from gpu_exporter.config import Config, SimulatorConfig
from gpu_exporter.http.admin import DRAIN_CLEAR_PATH
from gpu_exporter.http.webconfig import load_web_config
from tests.helpers import (
    Series,
    drained,
    make_config,
    one,
    parse_exposition,
    running_exporter,
    running_simulation,
    select,
)
from tests.web_helpers import PASSWORD, USER, Pki, bcrypt_hash, write_web_config


def simulated(tmp_path: Path, **overrides: Any) -> Config:
    return make_config(
        simulator=SimulatorConfig(),
        fast_interval=0.2,
        slow_interval=1.0,
        kmsg_path=tmp_path / "kmsg",
        state_dir=tmp_path / "state",
        **overrides,
    )


async def scrape(session: aiohttp.ClientSession) -> Series:
    async with session.get("/metrics") as response:
        return parse_exposition(await response.text())


def uuid_of(series: Series, gpu: str) -> str:
    (labels,) = select(series, "gpu_info", gpu=gpu)
    return dict(labels)["uuid"]


async def drain_latched(exporter: Exporter, session: aiohttp.ClientSession, gpu: str) -> Series:
    """Scrape after each render until GPU ``gpu`` has a hardware_xid drain (bounded)."""
    for _ in range(50):
        series = await scrape(session)
        if drained(series, "hardware_xid", gpu=gpu) == 1:
            return series
        await exporter.sampler.wait_for_news()
    raise AssertionError(f"GPU {gpu} never latched a drain")


async def post(session: aiohttp.ClientSession, body: Any, **kwargs: Any) -> tuple[int, str]:
    async with session.post(DRAIN_CLEAR_PATH, json=body, **kwargs) as response:
        return response.status, await response.text()


async def test_the_admin_api_is_off_by_default(tmp_path: Path) -> None:
    async with (
        running_exporter(simulated(tmp_path)) as exporter,
        aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session,
    ):
        status, _ = await post(session, {"uuid": "GPU-0"})
        assert status == 404, "without --web.enable-admin-api there must be no admin endpoint"


async def test_an_operator_clears_a_drain_the_exporter_could_not_see_repaired(
    tmp_path: Path,
) -> None:
    async with (
        running_simulation(simulated(tmp_path, web_enable_admin_api=True)) as (exporter, sim),
        aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session,
    ):
        sim.node.inject({"type": "xid", "gpu": 1, "code": 48})
        series = await drain_latched(exporter, session, "1")
        uuid = uuid_of(series, "1")

        status, text = await post(session, {"uuid": uuid, "reason": "row_remap_failure"})
        assert (status, text) == (200, f'{{"uuid": "{uuid}", "cleared": []}}'), (
            "a reason that was not set is not cleared, and that is not an error"
        )
        status, text = await post(session, {"uuid": uuid})
        assert status == 200, text
        assert '"cleared": ["hardware_xid"]' in text

        series = await scrape(session)
        assert drained(series, "hardware_xid", gpu="1") == 0
        assert one(series, "gpu_xid_errors_total", gpu="1", xid="48") == 1, "counts stay"


@pytest.mark.parametrize(
    ("body", "content_type", "status", "says"),
    [
        ('{"uuid": "GPU-1"}', "text/plain", 415, "application/json"),
        ("{not json", "application/json", 400, "not JSON"),
        ('["GPU-1"]', "application/json", 400, "must be an object"),
        ('{"uuid": "MIG-1"}', "application/json", 400, "uuid"),
        ('{"uuid": "GPU-1", "reason": "bored"}', "application/json", 400, "reason"),
        ('{"uuid": "GPU-1", "gpu": 1}', "application/json", 400, "unknown key 'gpu'"),
        # Each of these was a 500 with a traceback.
        ('{"uuid": "GPU-1"}', "application/json; charset=bogus", 400, "unsupported charset"),
        (b'{"uuid": "GPU-\xff"}', "application/json", 400, "not UTF-8 text"),
        ("[" * 30_000 + "]" * 30_000, "application/json", 400, "nested too deeply"),
    ],
)
async def test_a_bad_request_is_refused_with_what_is_wrong(
    tmp_path: Path, body: str | bytes, content_type: str, status: int, says: str
) -> None:
    async with (
        running_exporter(simulated(tmp_path, web_enable_admin_api=True)) as exporter,
        aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session,
        session.post(
            DRAIN_CLEAR_PATH, data=body, headers={"Content-Type": content_type}
        ) as response,
    ):
        assert response.status == status
        assert says in await response.text()


async def test_the_admin_api_needs_the_web_configs_credentials(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path)
    web_config = write_web_config(
        tmp_path,
        "tls_server_config: {cert_file: server.crt, key_file: server.key}\n"
        f"basic_auth_users:\n  {USER}: {bcrypt_hash(PASSWORD)}\n",
    )
    config = simulated(
        tmp_path,
        web_enable_admin_api=True,
        web_config_file=web_config,
        web=load_web_config(web_config),
    )
    connector = aiohttp.TCPConnector(ssl=pki.client_context())
    async with (
        running_exporter(config) as exporter,
        aiohttp.ClientSession(f"https://127.0.0.1:{exporter.port}", connector=connector) as session,
    ):
        status, _ = await post(session, {"uuid": "GPU-1"})
        assert status == 401, "clearing a drain must take the same credentials as scraping"
        credentials = {"Authorization": aiohttp.encode_basic_auth(USER, PASSWORD)}
        with capture_logs() as logs:
            status, text = await post(session, {"uuid": "GPU-1"}, headers=credentials)
        assert (status, text) == (200, '{"uuid": "GPU-1", "cleared": []}')
        (cleared,) = [
            e for e in logs if e["event"] == "drain recommendation cleared by an operator"
        ]
        assert cleared["by"] == f"{USER}@127.0.0.1", "the log must say who cleared it"
