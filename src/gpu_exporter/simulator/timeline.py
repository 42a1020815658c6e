"""The simulated node's scheduled events, soonest first."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator

from gpu_exporter.simulator.scenario import EventSpec


class Timeline:
    """Events by simulated time; ties keep the order they were scheduled in.

    ``on_sooner`` runs when a newly scheduled event becomes the next one: event threads asleep
    until the previous next one must wake and wait anew (``SimulatedNode.seconds_until_due``).
    """

    def __init__(self, on_sooner: Callable[[], None]) -> None:
        self._heap: list[tuple[float, int, EventSpec]] = []
        self._sequence = itertools.count()
        self._on_sooner = on_sooner

    def schedule(self, event: EventSpec, at: float) -> None:
        entry = (at, next(self._sequence), event)
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry:
            self._on_sooner()

    def next_at(self) -> float | None:
        """When the next event is due; safe without the node's lock (one read of the head)."""
        head = next(iter(self._heap), None)
        return None if head is None else head[0]

    def pop_due(self, t: float) -> Iterator[tuple[float, EventSpec]]:
        """Take out every event due by ``t``, soonest first (including ones scheduled meanwhile)."""
        while self._heap and self._heap[0][0] <= t:
            at, _, event = heapq.heappop(self._heap)
            yield at, event

    def upcoming(self, count: int) -> list[tuple[float, EventSpec]]:
        return [(at, event) for at, _, event in heapq.nsmallest(count, self._heap)]
