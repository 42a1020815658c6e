"""When the exposition is rendered: on read, once per round, and off the loop while scraped.

A round only marks the exposition stale. Reading it renders, and a job's samples are formatted
by that first render, unless the exposition was read since the previous round: then the jobs
format their own lines on the worker threads, where they do not hold the event loop."""

from __future__ import annotations

import threading

import pytest

from gpu_exporter import exposition
from gpu_exporter.collectors import Cadence
from tests.helpers import SimulatedSampler, simulated_sampler

SCENARIO = "gpus: [{model: H100-SXM-80GB}, {model: H100-SXM-80GB}]"


@pytest.fixture
def formatting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread of every sample value formatted."""
    threads: list[str] = []
    original = exposition.format_value

    def format_value(value: float) -> str:
        threads.append(threading.current_thread().name)
        return original(value)

    monkeypatch.setattr(exposition, "format_value", format_value)
    return threads


async def fast_round(sim: SimulatedSampler) -> None:
    sim.clock.advance(1.0)
    await sim.sampler.sample_round(Cadence.FAST)


async def test_rounds_nobody_reads_format_nothing(formatting: list[str]) -> None:
    async with simulated_sampler(SCENARIO) as sim:
        formatting.clear()
        for _ in range(3):
            await fast_round(sim)
        assert formatting == [], "a round that no one read formatted its samples"
        text = sim.sampler.exposition.text.decode()
    assert 'gpu_power_watts{gpu="1"' in text, "the read after the rounds lacks their samples"
    assert formatting, "the read rendered nothing"


async def test_reads_between_rounds_share_one_render_and_a_round_renders_anew() -> None:
    async with simulated_sampler(SCENARIO) as sim:
        await fast_round(sim)
        first = sim.sampler.exposition
        assert sim.sampler.exposition is first, "a second read rendered again"
        await fast_round(sim)
        second = sim.sampler.exposition
        assert second is not first, "a read after a round served the old render"
        sim.sampler.note_news()
        assert sim.sampler.exposition is not second, "news from an event source was not rendered"


async def test_while_scraped_the_jobs_format_on_the_workers(formatting: list[str]) -> None:
    async with simulated_sampler(SCENARIO) as sim:
        await fast_round(sim)
        sim.sampler.exposition  # noqa: B018  (a scraper read this round)
        formatting.clear()
        await fast_round(sim)
        formatted_by_jobs = set(formatting)
        formatting.clear()
        sim.sampler.exposition  # noqa: B018
        on_loop = len(formatting)
    loop = threading.current_thread().name
    assert formatted_by_jobs, "the round after a read left its formatting to the next read"
    assert loop not in formatted_by_jobs, f"jobs formatted on the loop thread {loop}"
    assert on_loop < 100, f"the read still formatted {on_loop} values on the loop"
