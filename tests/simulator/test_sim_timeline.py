"""The node's timeline: soonest first, and a word to the waiters when the next event moves up."""

from __future__ import annotations

from gpu_exporter.simulator.scenario import EventSpec
from gpu_exporter.simulator.timeline import Timeline


def event(name: str) -> EventSpec:
    return EventSpec("xid", {}, {"type": "xid", "name": name})


def test_events_come_out_soonest_first_and_ties_in_the_order_scheduled() -> None:
    timeline = Timeline(on_sooner=lambda: None)
    for at, name in ((5.0, "late"), (1.0, "first"), (1.0, "second"), (9.0, "not yet")):
        timeline.schedule(event(name), at)
    due = [(at, spec.raw["name"]) for at, spec in timeline.pop_due(5.0)]
    assert due == [(1.0, "first"), (1.0, "second"), (5.0, "late")]
    assert timeline.next_at() == 9.0


def test_waiters_are_told_only_when_the_next_event_moves_up() -> None:
    told: list[float] = []
    timeline = Timeline(on_sooner=lambda: told.append(timeline_next()))

    def timeline_next() -> float:
        at = timeline.next_at()
        assert at is not None
        return at

    timeline.schedule(event("a"), 10.0)  # the first: sooner than nothing
    timeline.schedule(event("b"), 20.0)  # behind the next one: waiters sleep on
    timeline.schedule(event("c"), 3.0)  # the new next one: waiters must wait anew
    assert told == [10.0, 3.0]


def test_an_empty_timeline_has_nothing_due() -> None:
    timeline = Timeline(on_sooner=lambda: None)
    assert timeline.next_at() is None
    assert list(timeline.pop_due(1e9)) == []
    assert timeline.upcoming(5) == []
