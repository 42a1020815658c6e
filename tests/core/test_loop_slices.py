"""A round's bookkeeping on the event loop comes in slices: after each round listener, each
settled batch and each gathered part of the exposition, the loop is handed back once the round
has held it for a millisecond (``sampler/slices.py``), so a scrape waits for one slice, not for
the whole round's accounting and gathering."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from gpu_exporter.exposition import Family, Sample, gauge
from tests.helpers import simulated_sampler

SCENARIO = "gpus: [{model: H100-SXM-80GB}]"
OVER_A_SLICE_S = 0.003  # longer than LOOP_SLICE_S: the sampler hands the loop back after it


class SlowListener:
    """A round listener that holds the loop past a slice and asks the loop to run something."""

    def __init__(self, name: str, order: list[str], *, slow: bool) -> None:
        self.name, self.order, self.slow = name, order, slow

    def round_done(self) -> None:
        self.order.append(self.name)
        if self.slow:
            time.sleep(OVER_A_SLICE_S)
            asyncio.get_running_loop().call_soon(self.order.append, "the loop ran")


class SlowSource:
    """A sample source whose samples take longer than a slice; it asks the loop to run meanwhile."""

    def __init__(self, name: str, order: list[str], *, slow: bool) -> None:
        self.name, self.order, self.slow = name, order, slow
        self.families: tuple[Family, ...] = (gauge(f"test_{name}", "A test source's series."),)

    def samples(self) -> Iterable[Sample]:
        self.order.append(self.name)
        if self.slow:
            time.sleep(OVER_A_SLICE_S)
            asyncio.get_running_loop().call_soon(self.order.append, "the loop ran")
        yield Sample(self.families[0], "", 1.0)


async def test_the_loop_runs_between_round_listeners_once_a_slice_is_used() -> None:
    order: list[str] = []
    async with simulated_sampler(SCENARIO) as sim:
        sim.sampler.add_round_listener(SlowListener("first", order, slow=True))
        sim.sampler.add_round_listener(SlowListener("second", order, slow=False))
        await sim.fast_round()
    assert order[:3] == ["first", "the loop ran", "second"], (
        f"the second listener ran before the loop got a turn: {order}"
    )


async def test_the_loop_runs_between_the_sources_a_scraped_round_gathers() -> None:
    order: list[str] = []
    async with simulated_sampler(SCENARIO) as sim:
        sim.sampler.add_source(SlowSource("first", order, slow=True))
        sim.sampler.add_source(SlowSource("second", order, slow=False))
        await sim.fast_round()
        text = sim.sampler.exposition.text.decode()  # a scraper read: the next round gathers
        await asyncio.sleep(0)  # what that read's render asked the loop to run
        order.clear()
        await sim.fast_round()
        gathered = list(order)
        latest = sim.sampler.exposition.text.decode()
    assert "test_first 1" in text, "the first source's series is missing"
    assert "test_second 1" in text, "the second source's series is missing"
    assert gathered[:3] == ["first", "the loop ran", "second"], (
        f"the round gathered the second source before the loop got a turn: {gathered}"
    )
    assert "test_second 1" in latest, "the sliced gathering lost the second source's series"
