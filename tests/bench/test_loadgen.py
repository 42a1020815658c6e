"""Repeated latency cells (bench/loadgen.py ``median_cell``): the bench keeps the cell whose p99
is the median, whole, and records every cell's p99 in the order measured."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from loadgen import LoadResult, median_cell


def cell(p50_ms: float, p99_ms: float, rps: float) -> LoadResult:
    return LoadResult(
        requests=1000,
        errors=0,
        p50_ms=p50_ms,
        p99_ms=p99_ms,
        max_ms=2 * p99_ms,
        rps=rps,
        body_bytes=100.0,
        generator="wrk",
    )


def test_the_median_p99_cell_is_kept_whole_with_every_p99_in_order() -> None:
    cells = [cell(0.1, 3.0, 100), cell(0.2, 1.0, 200), cell(0.3, 2.0, 300)]
    kept = median_cell(cells)
    assert (kept["p50_ms"], kept["p99_ms"], kept["rps"]) == (0.3, 2.0, 300), (
        "the kept p50 and rate must come from the same cell as the median p99"
    )
    assert kept["p99_ms_cells"] == [3.0, 1.0, 2.0], "every cell's p99, in the order measured"


def test_of_an_even_count_the_upper_middle_cell_is_kept() -> None:
    kept = median_cell([cell(0.1, 4.0, 1), cell(0.1, 1.0, 2), cell(0.1, 3.0, 3), cell(0.1, 2.0, 4)])
    assert kept["p99_ms"] == 3.0, "the upper of the two middle cells: never the better-looking one"


def test_a_single_cell_is_reported_as_measured() -> None:
    kept = median_cell([cell(0.1, 1.5, 10)])
    assert kept == cell(0.1, 1.5, 10).as_dict(), "one cell: no cell list, nothing changed"


def test_no_cells_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one cell"):
        median_cell([])
