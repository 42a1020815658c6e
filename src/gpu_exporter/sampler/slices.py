"""Long work on the event loop, cut into slices: scrapes are answered between them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")

# The longest a round's bookkeeping holds the event loop before it lets scrapes in. A scrape
# arriving meanwhile waits this long at most; each hand-back costs one loop iteration.
LOOP_SLICE_S = 0.001


class LoopSlices:
    """Hands the event loop back (``await asyncio.sleep(0)``) whenever the caller has held it for
    ``slice_s`` since the last hand-back. On ``mig56`` under 8 scrapers, a round's outcomes,
    accounting and gathered blocks held the loop for up to 5 ms in one callback, which every
    scrape in flight waited out (docs/performance.md)."""

    def __init__(self, slice_s: float = LOOP_SLICE_S) -> None:
        self._slice_s = slice_s
        self._until = time.perf_counter() + slice_s

    async def pause_if_due(self) -> None:
        if time.perf_counter() >= self._until:
            await asyncio.sleep(0)
            self._until = time.perf_counter() + self._slice_s


async def gather_in_slices(items: Iterable[T], slices: LoopSlices) -> list[T]:
    """``items`` as a list, pausing between items when a slice is used up (``items`` may compute
    each one as it is reached: the sources' samples)."""
    gathered: list[T] = []
    for item in items:
        gathered.append(item)
        await slices.pause_if_due()
    return gathered
