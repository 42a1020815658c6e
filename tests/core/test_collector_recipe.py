"""docs/design.md's "Adding a collector" and "Adding a collector option" recipes, followed to the
letter by a trivial collector; the real collectors' options declared the same way; and what
happens when a collector has a bug (it is loud, and not an NVML error)."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import FrozenInstanceError, dataclass, fields, is_dataclass, replace
from importlib import import_module
from pkgutil import iter_modules

import pynvml
import pytest
from structlog.testing import capture_logs

from gpu_exporter import cli, collectors
from gpu_exporter.collectors import (
    ALL_COLLECTORS,
    Cadence,
    Collector,
    CollectorContext,
    SampleWriter,
    option,
    option_classes,
)
from gpu_exporter.devices import Device
from gpu_exporter.exposition import gauge, label_string
from gpu_exporter.nvml import DeviceCalls, WorkerPool
from gpu_exporter.sampler import Sampler
from gpu_exporter.settings import CollectorOptions, declared_flags
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
DIE_TEMPERATURE = gauge(
    "gpu_recipe_die_temperature_celsius",
    "The die temperature, again, in °C (°F with --collector.recipe.fahrenheit).",
)
_DIE = label_string({"sensor": "gpu"})


# "Adding a collector option": a frozen dataclass of option() fields beside the collector.
@dataclass(frozen=True)
class RecipeOptions:
    fahrenheit: bool = option(
        "--collector.recipe.fahrenheit", False, help="the die temperature in °F instead"
    )


class RecipeCollector(Collector):
    name = "recipe"
    help = "The design doc's example collector."
    cadence = Cadence.FAST
    families = (DIE_TEMPERATURE,)
    options = (RecipeOptions,)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._fahrenheit = context.options.of(RecipeOptions).fahrenheit

    # Step 2: NVML only through calls.get; samples through out.add.
    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        value = calls.get(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
        if value is not None:
            out.add(DIE_TEMPERATURE, value * 9 / 5 + 32 if self._fahrenheit else value, _DIE)


class BuggyCollector(RecipeCollector):
    name = "buggy"

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        calls.get(pynvml.nvmlDeviceGetTemperature, self.device.handle)  # forgot the sensor


@asynccontextmanager
async def sampler_with(
    collector: type[Collector], options: CollectorOptions | None = None
) -> AsyncIterator[tuple[Sampler, ManualClock]]:
    clock = ManualClock()
    scenario = loads_scenario(textwrap.dedent("gpus: [{model: H100-SXM-80GB}]"), "<test>")
    node = SimulatedNode(scenario, clock=clock)
    install(node)
    pool = WorkerPool(size=2)
    config = make_config(collectors=frozenset({"temperature", collector.name}))
    if options is not None:
        config = replace(config, collector_options=options)
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


def test_a_collector_option_is_a_flag_parsed_into_the_collectors_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Declared beside the collector only: config.py and cli.py do not name it."""
    monkeypatch.setattr(collectors, "ALL_COLLECTORS", (*ALL_COLLECTORS, RecipeCollector))
    assert "--collector.recipe.fahrenheit" in cli.build_parser().format_help()
    given = cli.parse_config(["--collector.recipe.fahrenheit"], environ={})
    assert given.collector_options.of(RecipeOptions) == RecipeOptions(fahrenheit=True)
    environ = {"GPU_EXPORTER_COLLECTOR_RECIPE_FAHRENHEIT": "true"}
    assert cli.parse_config([], environ=environ).collector_options.of(RecipeOptions).fahrenheit
    assert cli.parse_config([], environ={}).collector_options.of(RecipeOptions) == RecipeOptions()


async def test_a_collector_option_reaches_the_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collectors, "ALL_COLLECTORS", (*ALL_COLLECTORS, RecipeCollector))
    options = cli.parse_config(["--collector.recipe.fahrenheit"], environ={}).collector_options
    async with sampler_with(RecipeCollector, options) as (sampler, clock):
        series = await fast_round(sampler, clock)
    celsius = one(series, "gpu_temperature_celsius", gpu="0", sensor="gpu")
    assert one(series, "gpu_recipe_die_temperature_celsius", gpu="0") == celsius * 9 / 5 + 32


def test_every_collector_option_is_declared_beside_a_collector_that_reads_it() -> None:
    for kind in option_classes(ALL_COLLECTORS):
        readers = [c for c in ALL_COLLECTORS if kind in c.options]
        assert kind.__module__ in {c.__module__ for c in readers}, (
            f"{kind.__name__} is declared in {kind.__module__}, not beside "
            f"{', '.join(c.__name__ for c in readers)}"
        )
        assert is_dataclass(kind), f"{kind.__name__}: a dataclass of option() fields"
        with pytest.raises(FrozenInstanceError):
            setattr(kind(), fields(kind)[0].name, None)
        flags = list(declared_flags(kind))
        assert len(flags) == len(fields(kind)), f"{kind.__name__}: every field is an option()"
        for flag in flags:
            assert flag.option.startswith("--collector."), flag.option


def test_every_options_class_in_the_collectors_package_is_named_by_a_collector() -> None:
    """An options class no collector names has no flags: its values would always be defaults."""
    named = set(option_classes(ALL_COLLECTORS))
    for module in iter_modules(collectors.__path__):
        found = import_module(f"{collectors.__name__}.{module.name}")
        for value in vars(found).values():
            if isinstance(value, type) and is_dataclass(value) and any(declared_flags(value)):
                assert value in named, f"{value.__name__}: add it to its collector's options"


def test_every_collector_option_flag_sets_its_value_and_nothing_else() -> None:
    for kind in option_classes(ALL_COLLECTORS):
        for flag, field in zip(declared_flags(kind), fields(kind), strict=True):
            assert flag.switch, f"{flag.option}: extend this test to valued options"
            flipped = f"--no-{flag.option[2:]}" if flag.default else flag.option
            parsed = cli.parse_config([flipped], environ={}).collector_options
            assert getattr(parsed.of(kind), field.name) is not flag.default, flag.option
            others = [k for k in option_classes(ALL_COLLECTORS) if k is not kind]
            assert all(parsed.of(k) == k() for k in others), f"{flag.option} set another"


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
