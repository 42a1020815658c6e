"""The one fixed-rate loop: ``async for _ in ticks(interval)`` (a leaf: imports nothing of ours)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


async def ticks(interval: float) -> AsyncIterator[None]:
    """Yield at once, then every ``interval`` seconds of loop time after the previous tick.

    The body's own run time counts against the interval (fixed rate, not fixed delay); a body
    that overruns skips the missed ticks rather than running them in a burst.
    """
    loop = asyncio.get_running_loop()
    next_tick = loop.time()
    while True:
        yield
        next_tick = max(next_tick + interval, loop.time())
        await asyncio.sleep(next_tick - loop.time())
