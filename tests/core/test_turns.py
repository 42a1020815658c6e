"""Turns: while scrapers read every round, one worker at a time runs the round's jobs and rests
after each slice of CPU, as long as the slice took, so that the event loop answering the
scrapers keeps most of the interpreter (sampler/turns.py). A slow or hung job holds no one back
for long, the rest a round takes is bounded, and rounds nobody reads run as before."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gpu_exporter.sampler import jobs
from gpu_exporter.sampler.turns import Turn, Turns
from tests.core.test_rendering import SCENARIO, fast_round
from tests.helpers import simulated_sampler

WAIT_S = 10.0  # for what must happen; a failure, not a pass, when it runs out


class Clocks:
    """A wall clock, a CPU clock and a sleep that only move when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0
        self.cpu = 0.0
        self.slept: list[float] = []

    def turns(self, **options: float) -> Turns:
        return Turns(
            clock=lambda: self.now,
            cpu_clock=lambda: self.cpu,
            sleep=self.slept.append,
            **options,
        )


def hold_turn(turns: Turns, entered: threading.Event, release: threading.Event) -> None:
    turn = turns.next(None)
    entered.set()
    release.wait(WAIT_S)
    turns.end(turn)


def start_holding(turns: Turns) -> tuple[threading.Thread, threading.Event, threading.Event]:
    entered, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=hold_turn, args=(turns, entered, release), daemon=True)
    thread.start()
    return thread, entered, release


def test_a_job_waits_while_another_has_its_turn() -> None:
    turns = Clocks().turns(max_turn=60.0)
    first, first_in, release_first = start_holding(turns)
    assert first_in.wait(WAIT_S), "the first job never got a turn"
    second, second_in, release_second = start_holding(turns)
    assert not second_in.wait(0.2), "a second job ran while the first had its turn"
    release_first.set()
    assert second_in.wait(WAIT_S), "the second job did not get the turn the first handed on"
    release_second.set()
    for thread in (first, second):
        thread.join(WAIT_S)


def test_a_job_that_overruns_its_turn_holds_no_one_back_and_hands_on_nothing() -> None:
    clocks = Clocks()
    turns = clocks.turns(max_turn=0.02)
    slow, slow_in, release_slow = start_holding(turns)
    assert slow_in.wait(WAIT_S)
    clocks.now += 0.021  # the first job is in a slow call: past its turn
    other, other_in, release_other = start_holding(turns)
    assert other_in.wait(WAIT_S), "a job waited behind one that overran its turn"
    release_slow.set()
    slow.join(WAIT_S)
    # The slow job's end must not end the turn the other took: a third still waits for it.
    third, third_in, release_third = start_holding(turns)
    assert not third_in.wait(0.2), "the overrunning job's end handed on a turn it no longer had"
    release_other.set()
    assert third_in.wait(WAIT_S), "the third job never got its turn"
    release_third.set()
    for thread in (other, third):
        thread.join(WAIT_S)


def test_a_turn_runs_jobs_until_a_slice_of_cpu_then_rests_as_long_within_the_budget() -> None:
    clocks = Clocks()
    turns = clocks.turns(share=0.5, slice_s=0.0005)
    turns.begin_round(rest_budget=0.0015)
    turn = turns.next(None)
    clocks.cpu += 0.0003
    assert turns.next(turn) is turn, "a turn ended before its slice of CPU was used"
    clocks.cpu += 0.0003  # 0.6 ms: past the slice
    turn = turns.next(turn)
    assert clocks.slept == pytest.approx([0.0006]), "the rest was not as long as the slice"
    clocks.cpu += 0.002
    turns.end(turn)
    assert clocks.slept[-1] == pytest.approx(0.0009), "the rest went past the round's budget"
    turns.end(turns.next(None))  # budget spent: no more rest this round
    assert len(clocks.slept) == 2, "a round rested past its budget"
    turns.begin_round(rest_budget=0.01)
    turn = turns.next(None)
    clocks.cpu += 0.001
    turns.end(turn)
    assert clocks.slept[-1] == pytest.approx(0.001), "a new round's budget was not granted"


def test_a_share_outside_zero_to_one_is_refused() -> None:
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match="share"):
            Turns(share=share)


@pytest.fixture
def turn_taking(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many jobs took a turn, and the most jobs that ran at once."""
    seen = {"turns": 0, "running": 0, "most_at_once": 0}
    lock = threading.Lock()
    original_take, original_run_job = Turns._take, jobs.run_job

    def take(self: Turns) -> Turn:
        with lock:
            seen["turns"] += 1
        return original_take(self)

    def run_job(job: jobs.Job, *, format_now: bool = False) -> jobs.JobOutcome:
        with lock:
            seen["running"] += 1
            seen["most_at_once"] = max(seen["most_at_once"], seen["running"])
        try:
            return original_run_job(job, format_now=format_now)
        finally:
            with lock:
                seen["running"] -= 1

    original_init = Turns.__init__

    def patient(self: Turns, **options: Any) -> None:  # no overrun on a slow test machine
        original_init(self, **{**options, "max_turn": 60.0})

    monkeypatch.setattr(Turns, "__init__", patient)
    monkeypatch.setattr(Turns, "_take", take)
    monkeypatch.setattr(jobs, "run_job", run_job)
    return seen


async def test_only_rounds_that_scrapers_read_take_turns(turn_taking: dict[str, int]) -> None:
    async with simulated_sampler(SCENARIO) as sim:
        await fast_round(sim)
        turn_taking.update(turns=0, most_at_once=0)
        await fast_round(sim)  # nobody read the last round
        assert turn_taking["turns"] == 0, "a round nobody read took turns"
        sim.sampler.exposition  # noqa: B018  (a scraper reads)
        await fast_round(sim)
        series = sim.series()
    assert turn_taking["turns"] >= 2, "the batches of a round after a read did not take turns"
    assert turn_taking["most_at_once"] == 1, "jobs of a round after a read ran at once"
    assert any(name == "gpu_power_watts" for name, _ in series), "the paced round lost samples"
