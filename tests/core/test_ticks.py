"""The fixed-rate loop's schedule (``ticks.following_tick``): every interval after the last tick,
missed ticks skipped, and with a phase on the loop clock's grid, so that loops given different
phases tick apart however their starts fell."""

from __future__ import annotations

import pytest

from gpu_exporter.ticks import following_tick


def test_without_a_phase_the_next_tick_is_an_interval_after_the_last() -> None:
    assert following_tick(100.3, 100.5, 1.0, None) == pytest.approx(101.3)


def test_a_body_that_overran_ticks_again_at_once_not_once_per_missed_tick() -> None:
    assert following_tick(100.3, 103.9, 1.0, None) == 103.9
    assert following_tick(100.5, 103.9, 1.0, 0.5) == pytest.approx(104.5), "missed ticks skipped"


def test_with_a_phase_ticks_fall_that_far_past_each_multiple_of_the_interval() -> None:
    rounds = [0.0]
    for _ in range(5):
        rounds.append(following_tick(rounds[-1], rounds[-1] + 0.02, 1.0, 0.0))
    polls = [13.37]  # a loop started at any moment: its first tick is at once
    for _ in range(5):
        polls.append(following_tick(polls[-1], polls[-1] + 0.02, 1.0, 0.5))
    assert rounds[1:] == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0])
    assert polls[1:] == pytest.approx([14.5, 15.5, 16.5, 17.5, 18.5])


def test_the_tick_after_the_first_is_at_least_half_an_interval_later() -> None:
    # Started just before a tick of its phase: the next is the one after, not 10 ms later.
    assert following_tick(4.49, 4.5, 1.0, 0.5) == pytest.approx(5.5)
    assert following_tick(4.2, 4.21, 1.0, 0.5) == pytest.approx(5.5), "4.5 is 0.3 s after"
    assert following_tick(4.0, 4.01, 1.0, 0.5) == pytest.approx(4.5)


def test_a_longer_interval_keeps_the_phase_past_its_own_multiples() -> None:
    assert following_tick(0.0, 0.1, 5.0, 0.5) == pytest.approx(5.5)
    assert following_tick(5.5, 5.6, 5.0, 0.5) == pytest.approx(10.5)
