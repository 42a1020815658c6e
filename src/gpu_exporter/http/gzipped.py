"""gzip bodies built off the event loop, once per render and encoding, shared by every scrape.

A render's gzip body is built on the first gzip scrape after the render (no scraper asking for
gzip, no compression). ``zlib`` releases the GIL while it deflates, so building it on a thread
keeps the loop answering other scrapes meanwhile (on ``gpu8``, ~140 KiB: about 0.6 ms, on
``mig56`` ~380 KiB: about 1.5 ms, that the loop would otherwise stand still for); scrapes that
arrive while it is built wait for the same body instead of compressing it again.
"""

from __future__ import annotations

import asyncio
from functools import partial

from ..exposition import Exposition


class GzipBodies:
    """The gzip body of an exposition, built on a thread; one build per render and encoding."""

    def __init__(self) -> None:
        # Keyed by id(): the entry holds the exposition, so its id is not reused meanwhile.
        self._building: dict[tuple[int, bool], tuple[Exposition, asyncio.Future[bytes]]] = {}

    async def body(self, exposition: Exposition, *, openmetrics: bool) -> bytes:
        cached = exposition.cached_gzip(openmetrics=openmetrics)
        if cached is not None:
            return cached
        key = (id(exposition), openmetrics)
        entry = self._building.get(key)
        if entry is None:
            build = partial(exposition.body, openmetrics=openmetrics, gzipped=True)
            future = asyncio.ensure_future(asyncio.to_thread(build))
            entry = self._building[key] = (exposition, future)
            future.add_done_callback(lambda _: self._building.pop(key, None))
        # Shielded: a scraper that hangs up must not cancel the body the others wait for.
        return await asyncio.shield(entry[1])
