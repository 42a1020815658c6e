"""Families the status page reads and ``/metrics`` does not serve (``served=False``)."""

from __future__ import annotations

from gpu_exporter.exposition import Sample, counter, gauge, render
from tests.helpers import select, simulated_sampler

STATUS_ONLY = (
    "gpu_sm_active_ratio",
    "gpu_tensor_active_ratio",
    "gpu_utilization_ratio",
    "gpu_clocks_event_active",
)


def test_an_unserved_family_is_rendered_apart_from_both_formats() -> None:
    seconds = counter("x_seconds_total", "Seconds.")
    flag = gauge("x_active", "1 while active.", served=False)
    exposition = render([Sample(seconds, "", 3.0), Sample(flag, "", 1.0)])
    assert b"x_active" not in exposition.text
    assert b"x_active" not in exposition.openmetrics
    assert exposition.unserved == (
        b"# HELP x_active 1 while active.\n# TYPE x_active gauge\nx_active 1\n"
    )
    assert b"x_seconds_total 3" in exposition.text


async def test_the_sampler_keeps_the_status_pages_instant_readings_off_metrics() -> None:
    scenario = """
        gpus: [{model: H100-SXM-80GB}]
        workloads: [{gpu: 0, pod: p, sm: 0.8}]
    """
    async with simulated_sampler(scenario) as sim:
        sim.inject({"type": "throttle", "gpu": 0, "reason": "hw_thermal_slowdown"})
        await sim.fast_round()
        await sim.fast_round()
        served, everything = sim.served(), sim.series()
    for name in STATUS_ONLY:
        assert select(everything, name), f"{name}: the status page's reading is rendered"
        assert not select(served, name), f"{name} is served on /metrics"
    throttled = select(everything, "gpu_clocks_event_active", reason="hw_thermal_slowdown")
    assert list(throttled.values()) == [1.0]
    assert select(served, "gpu_clocks_event_seconds_total", reason="hw_thermal_slowdown")
