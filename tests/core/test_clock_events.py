"""Clock-event counters: read from the field ids the running driver gives them, and only while
they behave like counters (issue 21)."""

from __future__ import annotations

import pytest

from gpu_exporter.collectors.counter_fields import CounterTableError, counter_fields, parse_table
from tests.helpers import Series, SimulatedSampler, one, simulated_sampler

THERMAL = "hw_thermal_slowdown"


def node(driver: str) -> str:
    return f"""
        node: {{driver_version: "{driver}"}}
        gpus: [{{model: H100-SXM-80GB}}]
        workloads: [{{gpu: 0, pod: p, sm: 0.9}}]
    """


def asked(sim: SimulatedSampler, ids: range | tuple[int, ...]) -> list[int]:
    return [fid for fid in ids if sim.node.field_requests[fid]]


def seconds(series: Series, reason: str = THERMAL) -> float:
    return one(series, "gpu_clocks_event_seconds_total", reason=reason)


async def short_throttle_time(sim: SimulatedSampler) -> float:
    """A 2.5 s thermal slowdown between two samples 5 s apart: the counter sees 2.5 s, while
    integrating the sampled flags would see none (the flag is off at both samples)."""
    before = await sim.fast_round()
    sim.inject({"type": "throttle", "gpu": 0, "reason": THERMAL, "duration": "2500ms"})
    after = await sim.fast_round(5.0)
    return seconds(after) - seconds(before)


@pytest.mark.parametrize(
    ("driver", "counters", "never"),
    [
        ("575.57.08", (251, 252, 253), range(254, 272)),
        ("580.65.06", (251, 252, 253), range(254, 272)),
        ("580.95.05", (269, 270, 271), range(251, 269)),
    ],
)
async def test_counters_are_read_from_the_ids_of_the_running_driver(
    driver: str, counters: tuple[int, ...], never: range
) -> None:
    async with simulated_sampler(node(driver)) as sim:
        assert await short_throttle_time(sim) == pytest.approx(2.5)
        assert asked(sim, counters) == list(counters)
        assert asked(sim, never) == [], f"on {driver} those ids are power-smoothing settings"


async def test_a_driver_without_thermal_counters_integrates_the_sampled_flags() -> None:
    async with simulated_sampler(node("570.172.08")) as sim:
        assert await short_throttle_time(sim) == 0.0, "the flag was off at both samples"
        sim.inject({"type": "throttle", "gpu": 0, "reason": THERMAL, "duration": "1h"})
        first = await sim.fast_round()
        later = await sim.fast_round(3.0)
        assert seconds(later) - seconds(first) == pytest.approx(3.0)
        assert asked(sim, range(230, 300)) == [230], "only the recovery action; no 251-271"


async def test_a_counter_that_runs_backwards_is_refused_once_and_the_total_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with simulated_sampler(node("580.95.05")) as sim:
        sim.inject({"type": "throttle", "gpu": 0, "reason": THERMAL})
        await sim.fast_round()
        good = seconds(await sim.fast_round(10.0))
        sim.inject({"type": "field_value", "gpu": 0, "field": 270, "value": 1_000})
        refused = seconds(await sim.fast_round(2.0))
        later = [seconds(await sim.fast_round(2.0)) for _ in range(3)]
    assert good == pytest.approx(11.0)
    assert refused == pytest.approx(good + 2.0), "integrated from the flag, from the same total"
    assert later == pytest.approx([good + 4.0, good + 6.0, good + 8.0])
    logged = [line for line in capsys.readouterr().out.splitlines() if "counter refused" in line]
    assert len(logged) == 1, logged
    assert "went backwards" in logged[0]
    assert "field=270" in logged[0] or '"field": 270' in logged[0]


async def test_a_counter_faster_than_wall_time_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with simulated_sampler(node("580.95.05")) as sim:
        await sim.fast_round()
        await sim.fast_round()
        sim.inject({"type": "field_value", "gpu": 0, "field": 271, "value": 5 * 10**12})
        series = await sim.fast_round()
    assert seconds(series, "hw_power_brake_slowdown") == 0.0, "5000 s in 1 s is no counter"
    logged = capsys.readouterr().out
    assert "advanced 5000.000 s in 2.000 s of wall time" in logged, "since its first reading"


async def test_a_field_that_is_not_a_64_bit_integer_is_never_taken_for_a_counter(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A power-smoothing ramp rate (mW/s, a 32-bit value) where the table says a counter is.
    async with simulated_sampler(node("580.95.05")) as sim:
        sim.inject(
            {"type": "field_value", "gpu": 0, "field": 271, "value": 5_000_000, "value_type": 1}
        )
        series = await sim.fast_round()
        series = await sim.fast_round()
    assert seconds(series, "hw_power_brake_slowdown") == 0.0
    assert "its value type is 1, not a counter's" in capsys.readouterr().out


async def test_an_unknown_field_id_is_remembered_like_not_supported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 535's header ends before 230: the driver answers InvalidArgument for it (simulated).
    async with simulated_sampler(node("535.183.01")) as sim:
        for _ in range(4):
            series = await sim.fast_round()
        assert sim.node.field_requests[230] == 1, "asked once, then remembered"
    assert one(series, "gpu_exporter_collector_success", collector="recovery") == 1
    assert not [k for k in series if k[0] == "gpu_exporter_nvml_errors_total"]
    out = capsys.readouterr().out
    assert '"signal": "field230"' in out or "field230" in out


@pytest.mark.parametrize(
    ("driver", "thermal"),
    [
        ("550.163.01", None),
        ("575.51.02", 252),
        ("580.76.05", 252),  # unverified: taken as 580.65 (no header release in between)
        ("580.82.07", 270),
        ("615.71", 270),
        ("not a version", None),  # the oldest row: no counter is trusted at an unknown id
    ],
)
def test_the_bundled_table_chooses_by_driver_version(driver: str, thermal: int | None) -> None:
    fields = counter_fields(driver)
    assert fields.get(THERMAL) == thermal
    assert (fields["sw_power_cap"], fields["sync_boost"]) == (74, 76)


def test_a_malformed_table_names_the_line() -> None:
    text = "from_driver\tsw_power_cap\n0\t74\n575\tx\n"
    with pytest.raises(CounterTableError, match=r"t.tsv:3: field ids are numbers or -"):
        parse_table(text, "t.tsv")
    with pytest.raises(CounterTableError, match="ascend"):
        parse_table("from_driver\ta\n580\t1\n575\t2\n", "t.tsv")


@pytest.mark.parametrize("cause", ["hw_thermal_slowdown", "hw_power_brake_slowdown"])
async def test_hw_slowdown_is_set_with_its_thermal_and_power_brake_sub_reasons(cause: str) -> None:
    async with simulated_sampler(node("580.95.05")) as sim:
        await sim.fast_round()
        sim.inject({"type": "throttle", "gpu": 0, "reason": cause})
        first = await sim.fast_round()
        later = await sim.fast_round(4.0)
    active = "gpu_clocks_event_active"
    assert one(later, active, reason=cause) == 1
    assert one(later, active, reason="hw_slowdown") == 1, "HwSlowdown nests its sub-reasons"
    assert one(later, active, reason="sw_thermal_slowdown") == 0
    for reason in (cause, "hw_slowdown"):
        assert seconds(later, reason) - seconds(first, reason) == pytest.approx(4.0)


async def test_hw_slowdown_alone_leaves_its_sub_reasons_clear() -> None:
    async with simulated_sampler(node("580.95.05")) as sim:
        sim.inject({"type": "throttle", "gpu": 0, "reason": "hw_slowdown"})
        series = await sim.fast_round()
    assert one(series, "gpu_clocks_event_active", reason="hw_slowdown") == 1
    assert one(series, "gpu_clocks_event_active", reason="hw_thermal_slowdown") == 0
    assert one(series, "gpu_clocks_event_active", reason="hw_power_brake_slowdown") == 0
