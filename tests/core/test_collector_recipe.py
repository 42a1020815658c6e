"""docs/design.md's "Adding a collector" recipe, followed to the letter by a trivial collector;
and what happens when a collector has a bug (it is loud, and not an NVML error)."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pynvml
import pytest
from structlog.testing import capture_logs

from gpu_exporter import cli, collectors
from gpu_exporter.collectors import ALL_COLLECTORS, Cadence, Collector, SampleWriter
from gpu_exporter.exposition import gauge, label_string
from gpu_exporter.nvml import DeviceCalls, WorkerPool
from gpu_exporter.sampler import Sampler
from gpu_exporter.simulator import SimulatedNode, install, loads_scenario, uninstall
from tests.helpers import (
    ManualClock,
    Series,
    SharedState,
    make_config,
    one,
    parse_exposition,
    select,
)

# Step 1: a module-level family, a pre-rendered label string, a Collector subclass.
DIE_TEMPERATURE = gauge("gpu_recipe_die_temperature_celsius", "The die temperature, again, in °C.")
_DIE = label_string({"sensor": "gpu"})


class RecipeCollector(Collector):
    name = "recipe"
    help = "The design doc's example collector."
    cadence = Cadence.FAST
    families = (DIE_TEMPERATURE,)

    # Step 2: NVML only through calls.get; samples through out.add.
    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        value = calls.get(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
        if value is not None:
            out.add(DIE_TEMPERATURE, value, _DIE)


class BuggyCollector(RecipeCollector):
    name = "buggy"

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        calls.get(pynvml.nvmlDeviceGetTemperature, self.device.handle)  # forgot the sensor


@asynccontextmanager
async def sampler_with(collector: type[Collector]) -> AsyncIterator[tuple[Sampler, ManualClock]]:
    clock = ManualClock()
    scenario = loads_scenario(textwrap.dedent("gpus: [{model: H100-SXM-80GB}]"), "<test>")
    node = SimulatedNode(scenario, clock=clock)
    install(node)
    pool = WorkerPool(size=2)
    config = make_config(collectors=frozenset({"temperature", collector.name}))
    # Step 3 is ALL_COLLECTORS; the sampler takes the same tuple as a parameter.
    sampler = SharedState().sampler(
        config, pool, collectors=(*ALL_COLLECTORS, collector), clock=clock
    )
    try:
        await sampler.start(background=False)
        yield sampler, clock
    finally:
        await sampler.stop()
        pool.shutdown()
        node.close()
        uninstall()


async def fast_round(sampler: Sampler, clock: ManualClock) -> Series:
    clock.advance(1.0)
    await sampler.sample_round(Cadence.FAST)
    return parse_exposition(sampler.exposition.text.decode())


async def test_a_collector_added_as_the_recipe_says_is_sampled_with_its_self_metrics() -> None:
    async with sampler_with(RecipeCollector) as (sampler, clock):
        series = await fast_round(sampler, clock)
    ours = one(series, "gpu_recipe_die_temperature_celsius", gpu="0", sensor="gpu")
    assert ours == one(series, "gpu_temperature_celsius", gpu="0", sensor="gpu")
    assert one(series, "gpu_exporter_collector_success", collector="recipe") == 1


def test_a_collector_in_all_collectors_gets_its_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collectors, "ALL_COLLECTORS", (*ALL_COLLECTORS, RecipeCollector))
    assert "recipe" in cli.parse_config([], environ={}).collectors
    assert "recipe" not in cli.parse_config(["--no-collector.recipe"], environ={}).collectors
    off = cli.parse_config([], environ={"GPU_EXPORTER_COLLECTOR_RECIPE": "false"})
    assert "recipe" not in off.collectors


@pytest.mark.collector_bug
async def test_a_collector_bug_is_logged_with_its_traceback_once_and_not_counted_as_nvml() -> None:
    async with sampler_with(BuggyCollector) as (sampler, clock):
        with capture_logs() as logs:
            for _ in range(3):
                series = await fast_round(sampler, clock)
    assert one(series, "gpu_exporter_collector_success", collector="buggy") == 0
    assert one(series, "gpu_exporter_collector_success", collector="temperature") == 1
    assert not select(series, "gpu_exporter_nvml_errors_total"), "a bug is not an NVML error"
    loud = [e for e in logs if e["event"] == "collector raised; this is a bug"]
    assert len(loud) == 1, f"one traceback per (collector, exception type), got {logs}"
    assert isinstance(loud[0]["exc_info"], TypeError)
    assert loud[0]["collector"] == "buggy"
