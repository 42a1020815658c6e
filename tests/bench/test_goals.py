"""The goals of ``make bench`` (bench/goals.py), judged on made-up reports: each verdict reads
the number it names from the run, compares it with its limit, and says "not measured" (None)
rather than met or missed when the run did not measure it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import goals


def peer(ours: float, theirs: float) -> dict[str, Any]:
    def server(share: float) -> dict[str, Any]:
        return {"idle": {"share_percent_net_p50": share}}

    return {"servers": {goals.OURS: server(ours), goals.PEER: server(theirs)}}


def mig56(*, rss: float, plain_p99: float, gzip_p99: float) -> dict[str, Any]:
    cell = {"p99_ms_cells": [1.0, 2.0, 3.0]}
    return {
        goals.GOAL_SHAPE: {
            "rss": {"exporter_peak_mib": rss},
            "latency": {
                "exporter": {
                    "plain/8": {**cell, "p99_ms": plain_p99},
                    "gzip/8": {**cell, "p99_ms": gzip_p99},
                    "gzip/64": {"p99_ms": 500.0},  # not a goal cell
                }
            },
        }
    }


def stall(max_ms: float, p99_ms: float = 3.0) -> dict[str, Any]:
    lag = {"max_ms": max_ms, "p99_ms": p99_ms, "wakeups": 29000, "interval_ms": 10.0}
    return {"seconds": 300.0, "loop_lag": lag}


def verdicts(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["goal"]: row for row in goals.judge(report)}


def test_resting_cpu_is_judged_as_a_ratio_to_the_peer_in_the_same_run() -> None:
    met = goals.resting_cpu(peer(0.7, 1.0))
    assert (met.measured, met.met) == (pytest.approx(0.7), True), met
    missed = goals.resting_cpu(peer(0.9, 1.0))
    assert (missed.measured, missed.met) == (pytest.approx(0.9), False), missed
    assert goals.resting_cpu(peer(0.8, 1.0)).met is True, "the limit itself is met"
    assert "0.90% against 1.00%" in missed.note, "the note must give both shares"


def test_a_peer_measured_at_zero_or_not_run_is_not_judged() -> None:
    assert goals.resting_cpu(peer(0.7, 0.0)).met is None, "no ratio to a 0% peer"
    assert goals.resting_cpu(None).met is None, "no peer run: not measured"


def test_rss_and_the_scrape_p99s_are_read_from_the_goal_shape() -> None:
    rows = verdicts({"shapes": mig56(rss=63.9, plain_p99=9.0, gzip_p99=10.5)})
    rss = rows["mig56: peak RSS, every default feature on"]
    assert (rss["measured"], rss["limit"], rss["met"]) == (63.9, 64.0, True), rss
    plain = rows["mig56: scrape p99 at 8 scrapers (plain)"]
    gzip = rows["mig56: scrape p99 at 8 scrapers (gzip)"]
    assert (plain["measured"], plain["met"]) == (9.0, True), plain
    assert (gzip["measured"], gzip["met"]) == (10.5, False), gzip
    assert gzip["note"] == "median cell of 1.00 2.00 3.00", "every cell's p99 is shown"


def test_other_shapes_do_not_stand_in_for_the_goal_shape() -> None:
    shapes = {"gpu8": mig56(rss=40, plain_p99=1, gzip_p99=1)[goals.GOAL_SHAPE]}
    rows = verdicts({"shapes": shapes})
    assert all(row["met"] is None for row in rows.values()), rows


def test_the_longest_stall_is_the_maximum_with_its_p99_in_the_note() -> None:
    met = goals.longest_stall(stall(19.9, p99_ms=2.5))
    assert (met.measured, met.limit, met.met) == (19.9, 20.0, True), met
    assert met.note == "p99 2.5 ms over 29000 wake-ups of a 10 ms timer in 300 s"
    assert goals.longest_stall(stall(20.1)).met is False
    assert goals.longest_stall(None).met is None, "no stall cell: not measured"


def test_a_run_that_measured_everything_judges_every_goal() -> None:
    report = {
        "shapes": mig56(rss=50, plain_p99=2, gzip_p99=2),
        "stall": stall(12.0),
        "peer": peer(0.5, 1.0),
    }
    rows = goals.judge(report)
    assert [row["met"] for row in rows] == [True] * 5, rows
    assert {row["unit"] for row in rows} == {"x", "MiB", "ms"}, rows
    assert set(rows[0]) == {"goal", "measured", "limit", "unit", "met", "note"}, (
        "the rows keep the results schema"
    )
