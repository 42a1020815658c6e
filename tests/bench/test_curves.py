"""The cost-curve sweep's node shapes and fits (bench/curves.py): every generated scenario is one
the simulator accepts, the holder sweep holds the number of pods it says, and the slopes are the
least-squares ones. The sweep itself runs for minutes (``python bench/curves.py --quick``)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from curves import CURVES_FULL, fits, mig_node_with, points

from gpu_exporter.simulator import load_scenario


def test_every_point_is_a_scenario_the_simulator_loads(tmp_path: Path) -> None:
    for sweep, label, _, scenario in points(CURVES_FULL):
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(scenario, sort_keys=False))
        load_scenario(path)  # raises ScenarioError naming the bad key
        pids = [w["pid"] for w in scenario["workloads"]]
        assert len(pids) == len(set(pids)), f"{sweep} {label}: two workloads share a pid"


def test_the_big_mig_node_repeats_the_pods_on_its_second_eight_gpus() -> None:
    node = mig_node_with(16, None)
    assert len(node["gpus"]) == 16
    assert len({w["pod"] for w in node["workloads"]}) == 200, "100 pods per 8 GPUs"
    assert max(w["gpu"] for w in node["workloads"]) == 15


def test_the_holder_sweep_keeps_exactly_that_many_pods() -> None:
    for holders in (0, 25, 100):
        node = mig_node_with(8, holders)
        assert len({a["pod"] for a in node["allocations"]}) == holders
        assert {w["pod"] for w in node["workloads"]} == {a["pod"] for a in node["allocations"]}


def test_fits_are_least_squares_slopes() -> None:
    row = {
        "idle_cpu_percent_net": 0.0,
        "sampler_cpu_ms_per_fast_round": 0.0,
        "scrape_p99_ms_at_8": 0.0,
        "peak_rss_mib": 0.0,
    }
    devices = [{**row, "x": x, "peak_rss_mib": 40 + 0.5 * x} for x in (1, 8, 16, 64)]
    result = {
        "devices": devices,
        "holders": [{**row, "x": 0}],  # one point: no slope
        "scrapers": [{"scrapers": n, "scrape_p99_ms": 2.0 * n, "rss_mib": 50.0} for n in (1, 8)],
    }
    slopes = fits(result)
    assert math.isclose(slopes["devices"]["peak_rss_mib"], 0.5)
    assert math.isclose(slopes["scrapers"]["scrape_p99_ms"], 2.0)
    assert math.isnan(slopes["holders"]["peak_rss_mib"]), "a single point has no slope"
