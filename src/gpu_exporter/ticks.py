"""The one fixed-rate loop: ``async for _ in ticks(interval)`` (a leaf: imports nothing of ours)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator


async def ticks(interval: float, phase: float | None = None) -> AsyncIterator[None]:
    """Yield at once, then every ``interval`` seconds of loop time (:func:`following_tick`).

    The body's own run time counts against the interval (fixed rate, not fixed delay); a body
    that overruns skips the missed ticks rather than running them in a burst. With ``phase``
    the ticks after the first fall where the loop clock reads ``phase`` past a multiple of
    ``interval``: loops given different phases tick apart, whenever each started.
    """
    loop = asyncio.get_running_loop()
    next_tick = loop.time()
    while True:
        yield
        next_tick = following_tick(next_tick, loop.time(), interval, phase)
        await asyncio.sleep(next_tick - loop.time())


def following_tick(previous: float, now: float, interval: float, phase: float | None) -> float:
    """The tick after one at ``previous``, asked at ``now``: ``interval`` after it, or without
    waiting when that time has passed. With ``phase``, the first time ``k * interval + phase``
    that is not before ``now`` and at least half an interval after ``previous`` (the first
    tick, at start, is anywhere; the next is not crowded against it)."""
    if phase is None:
        return max(previous + interval, now)
    earliest = max(previous + interval / 2, now)
    return math.ceil((earliest - phase) / interval) * interval + phase
