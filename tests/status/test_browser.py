"""The status page as a person sees it: headless Chromium loads it from a running simulated
exporter, and the test reads the DOM Chromium built (no JavaScript on the page to run)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gpu_exporter.app import Exporter, build_exporter
from gpu_exporter.cli import host_for
from gpu_exporter.collectors import Cadence
from gpu_exporter.config import SimulatorConfig
from tests.helpers import make_config
from tests.status.browser import Elements, rendered_dom
from tests.status.helpers import notebook_seen_idle


@pytest.fixture
async def exporter() -> AsyncIterator[Exporter]:
    config = make_config(simulator=SimulatorConfig(), fast_interval=0.2, slow_interval=1.0)
    running = build_exporter(config, host_for(config))
    await running.start()
    try:
        await running.sampler.wait_for_rounds(Cadence.FAST, 2)
        yield running
    finally:
        await running.stop()


def row_of(page: Elements, gpu: str, kind: str = "gpu") -> str:
    texts = [
        text
        for attrs, text in page.rows
        if attrs.get("data-kind") == kind and text.split()[0] == gpu
    ]
    assert len(texts) == 1, f"expected one {kind} row for GPU {gpu}: {texts}"
    return texts[0]


async def test_chromium_shows_every_device_its_holders_and_bars(exporter: Exporter) -> None:
    async with aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session:
        await notebook_seen_idle(exporter, session)
    dom = await asyncio.to_thread(rendered_dom, f"http://127.0.0.1:{exporter.port}/")
    page = Elements(dom)
    kinds = [attrs.get("data-kind") for attrs, _ in page.rows if "data-kind" in attrs]
    assert (kinds.count("gpu"), kinds.count("mig")) == (8, 4), "8 GPUs and 4 MIG instances"
    bars = page.with_class("bar")
    assert len(bars) >= 12 * 2, "SM and tensor bars for every device that has GPM"
    assert all(a.get("aria-label") for a in bars), "each bar says its value in words"
    shared = row_of(page, "4")
    assert "inference/llm-serve-a/server" in shared
    assert "inference/llm-serve-b/server" in shared
    assert "allocated but idle" in row_of(page, "5")
    assert not [tag for tag, _ in page.elements if tag in ("script", "link")], (
        "no script and no external asset"
    )


async def test_chromium_shows_a_drain_after_a_hardware_xid(exporter: Exporter) -> None:
    async with (
        aiohttp.ClientSession(f"http://127.0.0.1:{exporter.port}") as session,
        session.post("/-/simulator/events", json={"type": "xid", "gpu": 2, "code": 48}) as reply,
    ):
        assert reply.status == 200, await reply.text()
    await exporter.sampler.wait_for_rounds(Cadence.FAST, 2)
    page = Elements(await asyncio.to_thread(rendered_dom, f"http://127.0.0.1:{exporter.port}/"))
    assert "drain:" in row_of(page, "2"), "GPU 2's health column names its drain reason"
    assert "drain:" not in row_of(page, "3"), "the other GPUs stay healthy"
    xid_rows = [text for attrs, text in page.rows if "xid" in attrs.get("class", "").split()]
    assert xid_rows, "the Xid table has rows"
    assert " 48 hardware " in f" {xid_rows[0]} ", f"newest Xid row: {xid_rows[0]}"
