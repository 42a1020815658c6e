"""gzip bodies: built once per render and encoding, on a thread, shared by concurrent scrapes."""

from __future__ import annotations

import asyncio
import gzip
import threading

from gpu_exporter.exposition import Exposition, Sample, gauge, render
from gpu_exporter.http.gzipped import GzipBodies

POWER = gauge("gpu_power_watts", "Power draw, in watts.")


class CountingExposition(Exposition):
    """Counts gzip builds, and where they ran."""

    builds: int = 0
    threads: set[str]

    def body(self, *, openmetrics: bool, gzipped: bool) -> bytes:
        if gzipped and self.cached_gzip(openmetrics=openmetrics) is None:
            self.builds += 1
            self.threads.add(threading.current_thread().name)
        return super().body(openmetrics=openmetrics, gzipped=gzipped)


def exposition() -> CountingExposition:
    plain = render([Sample(POWER, f'gpu="{i}"', 300.5) for i in range(500)], [POWER])
    counted = CountingExposition(plain.text, plain.openmetrics)
    counted.threads = set()
    return counted


async def test_concurrent_gzip_scrapes_of_one_render_share_one_build_off_the_loop() -> None:
    bodies, render_ = GzipBodies(), exposition()
    answers = await asyncio.gather(*(bodies.body(render_, openmetrics=False) for _ in range(8)))
    assert render_.builds == 1, "eight scrapes of one render compressed it more than once"
    assert threading.main_thread().name not in render_.threads, "gzip was built on the loop"
    assert {gzip.decompress(a) for a in answers} == {render_.text}
    await bodies.body(render_, openmetrics=False)
    assert render_.builds == 1, "a built body is kept for the render's later scrapes"
    openmetrics = await bodies.body(render_, openmetrics=True)
    assert gzip.decompress(openmetrics) == render_.openmetrics
    assert render_.builds == 2, "each encoding is built once"


async def test_a_scraper_that_hangs_up_does_not_cancel_the_body_others_wait_for() -> None:
    bodies, render_ = GzipBodies(), exposition()
    leaving = asyncio.ensure_future(bodies.body(render_, openmetrics=False))
    staying = asyncio.ensure_future(bodies.body(render_, openmetrics=False))
    await asyncio.sleep(0)  # both are waiting on the build
    leaving.cancel()
    assert gzip.decompress(await staying) == render_.text
    assert render_.builds == 1
