"""When the exposition is rendered: on read, once per round, and off the loop while scraped.

A round nobody reads only marks the exposition stale: the next read renders it (a scrape's on
a thread), and a job's samples are formatted by that first render. While the exposition is
scraped every round (the ``/metrics`` handler tells the sampler with ``note_read``), the jobs
format their own lines on the worker threads and the round's end renders the whole exposition
on a thread, so that the next scrape finds it ready. Reading the exposition by itself steers
nothing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence

import pytest

from gpu_exporter import exposition
from gpu_exporter.collectors import Cadence
from tests.helpers import SimulatedSampler, simulated_sampler

SCENARIO = "gpus: [{model: H100-SXM-80GB}, {model: H100-SXM-80GB}]"
SOURCE_SERIES = exposition.gauge("gpu_source_series", "A series another part serves.")


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


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread of every render of the whole exposition."""
    threads: list[str] = []
    original = exposition.render_blocks

    def render_blocks(*args: object) -> exposition.Exposition:
        threads.append(threading.current_thread().name)
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr("gpu_exporter.sampler.core.render_blocks", render_blocks)
    return threads


class HeldRenders:
    """Renders on any thread but the loop's wait for :attr:`release` once :attr:`started` is
    set; every render's thread is recorded in :attr:`threads`."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.threads: list[threading.Thread] = []


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> HeldRenders:
    renders = HeldRenders()
    loop = threading.current_thread()
    original = exposition.render_blocks

    def held_off_the_loop(*args: object) -> exposition.Exposition:
        renders.threads.append(threading.current_thread())
        if threading.current_thread() is not loop:
            renders.started.set()
            renders.release.wait(10)
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr("gpu_exporter.sampler.core.render_blocks", held_off_the_loop)
    return renders


async def fast_round(sim: SimulatedSampler) -> None:
    sim.clock.advance(1.0)
    await sim.sampler.sample_round(Cadence.FAST)


def scrape(sim: SimulatedSampler) -> exposition.Exposition:
    """What the ``/metrics`` handler does: tell the sampler a scraper reads, then read."""
    sim.sampler.note_read()
    return sim.sampler.exposition


async def test_rounds_nobody_reads_format_nothing(formatting: list[str]) -> None:
    async with simulated_sampler(SCENARIO) as sim:
        formatting.clear()
        for _ in range(3):
            await fast_round(sim)
        assert formatting == [], "a round that no one read formatted its samples"
        text = sim.sampler.exposition.text.decode()
    assert 'gpu_energy_joules_total{gpu="1"' in text, "the read after the rounds lacks samples"
    assert formatting, "the read rendered nothing"


async def test_a_scrape_of_rounds_nobody_read_renders_them_on_a_thread(
    renders: list[str], formatting: list[str]
) -> None:
    async with simulated_sampler(SCENARIO) as sim:
        for _ in range(2):
            await fast_round(sim)
        renders.clear()
        formatting.clear()
        sim.sampler.note_read()
        first, second = await asyncio.gather(
            sim.sampler.read_exposition(), sim.sampler.read_exposition()
        )
    loop = threading.current_thread().name
    assert len(renders) == 1, f"two scrapes at once rendered {len(renders)} times, not once"
    assert loop not in renders, "the scrape rendered the unread rounds on the loop thread"
    assert formatting, "the scrape's render formatted nothing"
    assert loop not in formatting, "the scrape formatted samples on the loop thread"
    assert first is second, "the second scrape did not wait for the render in flight"
    assert 'gpu_energy_joules_total{gpu="1"' in first.text.decode(), "the render lacks the rounds"


async def test_a_scraper_hanging_up_does_not_stop_the_render_another_waits_for(
    held: HeldRenders,
) -> None:
    started, release, threads = held.started, held.release, held.threads
    async with simulated_sampler(SCENARIO) as sim:
        await fast_round(sim)
        sim.sampler.note_read()
        hung_up = asyncio.create_task(sim.sampler.read_exposition())
        waiting = asyncio.create_task(sim.sampler.read_exposition())
        assert await asyncio.to_thread(started.wait, 10), "the read did not render on a thread"
        hung_up.cancel()
        await asyncio.gather(hung_up, return_exceptions=True)
        release.set()
        served = await waiting
    assert threading.current_thread() not in threads, "the reads rendered on the loop thread"
    assert len(threads) == 1, f"{len(threads)} renders for two reads of one round"
    served_text = served.text.decode()
    assert 'gpu_energy_joules_total{gpu="1"' in served_text, "the read served an empty render"


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


async def during_a_round_after_a_read(sim: SimulatedSampler, recorded: list[str]) -> list[str]:
    """What ``recorded`` gathered during a fast round that followed a scraper's read; it is
    left empty, to gather what comes after."""
    await fast_round(sim)
    scrape(sim)
    recorded.clear()
    await fast_round(sim)
    during = list(recorded)
    recorded.clear()
    return during


async def test_while_scraped_the_jobs_format_on_the_workers(formatting: list[str]) -> None:
    async with simulated_sampler(SCENARIO) as sim:
        formatted_by_jobs = set(await during_a_round_after_a_read(sim, formatting))
        scrape(sim)
        on_loop = len(formatting)
    loop = threading.current_thread().name
    assert formatted_by_jobs, "the round after a read left its formatting to the next read"
    assert loop not in formatted_by_jobs, f"jobs formatted on the loop thread {loop}"
    assert on_loop < 100, f"the read still formatted {on_loop} values on the loop"


async def test_while_scraped_a_round_is_rendered_on_a_thread_before_the_next_read(
    renders: list[str],
) -> None:
    async with simulated_sampler(SCENARIO) as sim:
        rendered_by_round = await during_a_round_after_a_read(sim, renders)
        text = sim.sampler.exposition.text.decode()
    loop = threading.current_thread().name
    assert len(rendered_by_round) == 1, f"the round rendered {len(rendered_by_round)} times"
    assert rendered_by_round[0] != loop, "the round rendered on the loop thread"
    assert renders == [], "the read after the round rendered it again"
    assert 'gpu_energy_joules_total{gpu="1"' in text, "the threaded render lacks the samples"


async def test_while_scraped_the_round_formats_the_self_metrics_on_its_render_thread(
    formatting: list[str],
) -> None:
    async with simulated_sampler(SCENARIO) as sim:
        formatted_by_round = await during_a_round_after_a_read(sim, formatting)
    loop = threading.current_thread().name
    by_render = [name for name in formatted_by_round if name.startswith("render")]
    assert by_render, "the round's render formatted none of the self-metrics' values"
    assert loop not in formatted_by_round, (
        f"the round formatted {formatted_by_round.count(loop)} values on the loop thread {loop}"
    )


class ThreadRecordingSource:
    """A source whose samples note the thread that generates each of them."""

    families: Sequence[exposition.Family] = (SOURCE_SERIES,)

    def __init__(self) -> None:
        self.reads: list[str] = []

    def samples(self) -> Iterator[exposition.Sample]:
        for gpu in ("0", "1"):
            self.reads.append(threading.current_thread().name)
            yield exposition.Sample(SOURCE_SERIES, f'gpu="{gpu}"', 1.0)


async def generated_by_a_scraped_round(frozen: bool) -> tuple[list[str], str]:
    """The threads that generated a source's samples for a round rendered as it settled (the
    exposition was read after the round before), and the exposition's text after it."""
    source = ThreadRecordingSource()
    async with simulated_sampler(SCENARIO) as sim:
        sim.sampler.add_source(source, frozen=frozen)
        await fast_round(sim)
        scrape(sim)
        source.reads.clear()
        await fast_round(sim)  # rendered on a thread as it settles
        text = sim.sampler.exposition.text.decode()
    return source.reads, text


async def test_the_sources_are_read_on_the_loop_as_their_samples_are_generated() -> None:
    reads, text = await generated_by_a_scraped_round(frozen=False)
    loop = threading.current_thread().name
    assert reads == [loop, loop], f"the source's samples were generated on {reads}, not the loop"
    assert 'gpu_source_series{gpu="1"} 1\n' in text, "the render lacks the source's samples"


async def test_a_frozen_sources_samples_are_generated_by_the_render_thread() -> None:
    reads, text = await generated_by_a_scraped_round(frozen=True)
    assert len(reads) == 2, f"the round's render generated the source's samples {reads}"
    assert all(name.startswith("render") for name in reads), (
        f"a frozen source's samples were generated on {reads}, not the render thread"
    )
    assert 'gpu_source_series{gpu="1"} 1\n' in text, "the render lacks the source's samples"


async def test_while_scraped_a_slow_round_settling_after_the_fast_one_is_rendered_ahead_too(
    renders: list[str],
) -> None:
    async with simulated_sampler(SCENARIO) as sim:
        await fast_round(sim)
        scrape(sim)
        await fast_round(sim)
        renders.clear()
        await sim.sampler.sample_round(Cadence.SLOW)  # the same tick: no scrape came between
        by_slow_round = list(renders)
        renders.clear()
        scrape(sim)
    loop = threading.current_thread().name
    assert by_slow_round, "the slow round was left to the next scrape to render"
    assert loop not in by_slow_round, "the slow round rendered on the loop thread"
    assert renders == [], "the scrape after the slow round rendered it on the loop"


async def test_a_round_settling_during_anothers_render_joins_it_and_returns_when_shown(
    held: HeldRenders, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release, threads = held.started, held.release, held.threads
    loop = threading.current_thread()
    async with simulated_sampler(SCENARIO) as sim:
        await fast_round(sim)
        previous = scrape(sim)
        threads.clear()
        fast = asyncio.create_task(fast_round(sim))
        assert await asyncio.to_thread(started.wait, 10), "the round did not render on a thread"
        publishing = asyncio.Event()
        publish = sim.sampler._publish_round

        async def settled_then_publish() -> None:
            publishing.set()
            await publish()

        monkeypatch.setattr(sim.sampler, "_publish_round", settled_then_publish)
        slow = asyncio.create_task(sim.sampler.sample_round(Cadence.SLOW))
        await asyncio.wait_for(publishing.wait(), 10)  # settled while the fast render is held
        await asyncio.sleep(0)
        assert not slow.done(), "the slow round returned before the exposition showed it"
        assert sim.sampler.exposition is previous, "a read during the render did not wait for it"
        release.set()
        await slow
        shown = sim.sampler.exposition
        await fast
    assert loop not in threads, "a round was rendered on the loop thread"
    assert len(threads) == 2, f"{len(threads)} renders: the slow round was not rendered again"
    assert shown is not previous, "the slow round returned before the exposition showed it"


async def test_rounds_nobody_reads_are_not_rendered_ahead(renders: list[str]) -> None:
    async with simulated_sampler(SCENARIO) as sim:
        await fast_round(sim)
        scrape(sim)
        await fast_round(sim)  # rendered ahead: the previous round was scraped
        renders.clear()
        for _ in range(3):
            await fast_round(sim)
    assert renders == [], "rounds nobody read were rendered"


async def test_a_read_that_is_not_a_scrape_leaves_the_next_round_as_it_was(
    formatting: list[str], renders: list[str]
) -> None:
    async with simulated_sampler(SCENARIO) as sim:
        await fast_round(sim)
        sim.sampler.exposition  # noqa: B018  (read, and no note_read: nobody was served)
        formatting.clear()
        renders.clear()
        await fast_round(sim)
    assert formatting == [], "reading the exposition made the next round format its samples"
    assert renders == [], "reading the exposition made the next round render ahead"


async def test_a_read_while_the_round_renders_gets_the_previous_round_and_keeps_news(
    held: HeldRenders,
) -> None:
    started, release = held.started, held.release
    async with simulated_sampler(SCENARIO) as sim:
        await fast_round(sim)
        previous = scrape(sim)
        round_task = asyncio.create_task(fast_round(sim))
        assert await asyncio.to_thread(started.wait, 10), "the round did not render on a thread"
        assert sim.sampler.exposition is previous, "a read during the round's render waited for it"
        sim.sampler.note_news()  # an event source's news while the round renders
        with_news = sim.sampler.exposition
        assert with_news is not previous, "news during the round's render was not rendered"
        release.set()
        await round_task
        assert sim.sampler.exposition is with_news, "the round's older render replaced a newer one"


async def test_a_round_after_a_read_serves_the_same_series_as_a_round_nobody_read() -> None:
    async with simulated_sampler(SCENARIO) as sim:
        await fast_round(sim)
        await fast_round(sim)  # nobody read the round before: it renders on this read
        unread = set(sim.series())
        await fast_round(sim)  # after a read: formatted on the workers, rendered on a thread
        read = set(sim.series())
    assert read == unread, (
        f"a round that scrapers read lost {sorted(unread - read)[:5]} "
        f"and gained {sorted(read - unread)[:5]}"
    )
    assert any(name == "gpu_power_watts" for name, _ in read), "the rounds sampled no power"
