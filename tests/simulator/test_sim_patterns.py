"""Activity patterns integrate exactly, however a window is cut: in one linear piece (a read a
second after the last, the usual case) or across the pattern's jumps."""

from __future__ import annotations

import pytest

from gpu_exporter.simulator.patterns import Bursty, Placed, Ramp, Steady, integrate, total_at

# Two workloads time-sliced on one device: their sum passes the cap of 1 while both are high.
SIGNALS = (
    Placed(Bursty(0.92, period=30.0, duty=0.8, low=0.35), origin=3.0),
    Placed(Ramp(0.1, 0.5, period=300.0), origin=0.0, weight=0.8),
)


def brute_force(signals: tuple[Placed, ...], a: float, b: float, steps: int = 200_000) -> float:
    width = (b - a) / steps
    return sum(total_at(signals, a + (i + 0.5) * width) for i in range(steps)) * width


def test_a_window_integrates_to_the_sum_of_its_one_second_pieces() -> None:
    whole = integrate(SIGNALS, 0.0, 120.0)
    pieces = [integrate(SIGNALS, float(t), t + 1.0) for t in range(120)]
    assert sum(p.integral for p in pieces) == pytest.approx(whole.integral, rel=1e-12)


def test_the_integral_of_a_clamped_sum_matches_a_brute_force_one() -> None:
    for a, b in ((0.0, 120.0), (10.0, 11.0), (26.5, 27.5)):  # jumps inside, none, one
        assert integrate(SIGNALS, a, b).integral == pytest.approx(
            brute_force(SIGNALS, a, b), rel=1e-4
        ), f"over [{a}, {b}]"


def test_the_time_at_zero_counts_only_where_every_signal_is_idle() -> None:
    bursty = (Placed(Bursty(1.0, period=10.0, duty=0.3), origin=0.0),)
    assert integrate(bursty, 0.0, 100.0).zero_time == pytest.approx(70.0)
    assert integrate(bursty, 4.0, 5.0).zero_time == pytest.approx(1.0)  # one idle piece
    assert integrate(bursty, 1.0, 2.0).zero_time == 0.0  # one busy piece
    assert integrate((Placed(Steady(0.0), 0.0),), 0.0, 5.0).zero_time == 5.0


def test_breakpoints_are_the_period_marks_strictly_inside_the_window() -> None:
    square = Bursty(1.0, period=10.0, duty=0.3)
    assert sorted(square.breakpoints(0.0, 25.0)) == pytest.approx([3.0, 10.0, 13.0, 20.0, 23.0])
    assert square.breakpoints(10.0, 13.0) == [], "a window's own ends are not breakpoints"
    assert square.breakpoints(-7.5, -6.0) == pytest.approx([-7.0])
    assert sorted(Placed(square, origin=100.0).breakpoints(100.0, 112.0)) == pytest.approx(
        [103.0, 110.0]
    )
