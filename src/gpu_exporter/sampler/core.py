"""Rounds: the :class:`Sampler` runs every collector on every device at its cadence, off the
event loop; the exposition is rendered from their results when it is next read (see the package
docstring)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pynvml

from ..collectors import ALL_COLLECTORS, Cadence, Collector, CollectorContext
from ..dcgm.readings import DcgmLink
from ..devices import Device, DeviceId, Gpu, SystemInfo, discover_gpu, init_nvml
from ..exposition import Exposition, render, render_blocks
from ..ledger import ActivityLedger
from ..logs import RateLimitedLog, get_logger
from ..migprofiles import MigProfileBook
from ..nvml import (
    DeviceLost,
    ErrorCounter,
    PoolExhausted,
    SupportRegistry,
    WorkerPool,
    error_name,
)
from ..settings import CollectorOptions
from ..ticks import ticks
from .health import loops_healthy, problems
from .jobs import Batch, Job, Pending, close_jobs, make_jobs, settle
from .liveness import GpuState, Liveness
from .outcomes import Outcomes
from .rendering import IdentityCache, Part, blocks_of, exposition_parts, family_order
from .selfmetrics import SelfMetrics
from .sources import DeviceListener, RoundListener, SampleSource

_log = get_logger("sampler")


@dataclass(frozen=True)
class SamplerSettings:
    """What the sampler is configured with, built from ``Config`` in ``app.sampler_settings``
    only. ``collectors``: the names switched on; ``init_timeout``: the first ``nvmlInit`` and each
    discovery; ``collector_durations``: serve each collector's worker time per round."""

    collectors: frozenset[str]
    collector_options: CollectorOptions
    fast_interval: float
    slow_interval: float
    nvml_timeout: float
    init_timeout: float
    collector_durations: bool

    def interval(self, cadence: Cadence) -> float:
        return self.fast_interval if cadence is Cadence.FAST else self.slow_interval


class Sampler:
    def __init__(
        self,
        settings: SamplerSettings,
        pool: WorkerPool,
        *,
        ledger: ActivityLedger,
        mig_profiles: MigProfileBook,
        errors: ErrorCounter,
        dcgm: DcgmLink,
        collectors: Sequence[type[Collector]] = ALL_COLLECTORS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``ledger``, ``mig_profiles`` and ``errors`` are shared with other parts (the
        composition root creates them): the collectors write the first two, and every NVML
        caller counts into ``errors``. ``dcgm`` says which devices DCGM serves and hands the
        activity collectors its readings."""
        self._settings = settings
        self._pool = pool
        self._collector_types = tuple(c for c in collectors if c.name in settings.collectors)
        self._clock = clock
        self._ledger = ledger
        self._dcgm = dcgm
        self._context = CollectorContext(
            fast_interval=settings.fast_interval,
            slow_interval=settings.slow_interval,
            options=settings.collector_options,
            clock=clock,
            ledger=ledger,
            mig_profiles=mig_profiles,
            dcgm=dcgm,
            on_remap_failure=self._remap_failed,
        )
        self._support = SupportRegistry()
        self._errors = errors
        self._rlog = RateLimitedLog(_log, period=60.0, clock=clock)
        self._outcomes = Outcomes(
            pool, self._errors, self._rlog, clock=clock, nvml_timeout=settings.nvml_timeout
        )
        self._sources: list[tuple[SampleSource, bool]] = []  # each with: frozen (add_source)
        self._identities = IdentityCache()
        self._self_metrics = SelfMetrics(
            (c.name for c in self._collector_types), durations=settings.collector_durations
        )
        self._listeners: list[DeviceListener] = []
        self._round_listeners: list[RoundListener] = []
        self._system: SystemInfo | None = None
        self._gpus: list[GpuState] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._round_counts = dict.fromkeys(Cadence, 0)
        self._last_round_end: float | None = None
        self._exposition = render([], ())
        self._news_count = 0  # rounds settled and event sources' news, so far
        self._shown = 0  # the news the exposition reflects
        self._ahead: int | None = None  # the news being rendered on a thread, if any
        self._rendering: asyncio.Future[None] | None = None  # done when no render is ahead
        self._on_demand = False  # the render in flight was asked for by a read
        self._renders: set[asyncio.Task[None]] = set()  # reads' renders on a thread
        # Renders have a thread of their own: a scrape must not wait behind the default
        # executor's other work (gzip bodies, web config reads) to have its round rendered.
        self._render_thread = concurrent.futures.ThreadPoolExecutor(1, "render")
        self._read = False  # note_read() since the last round was submitted
        self._read_since_fast_round = False  # note_read() since the last fast round settled
        self._scraped = False  # note_read() in the fast interval before that
        self._family_order = family_order(self._collector_types, self._sources)
        self._news = asyncio.Event()
        self._nvml_up = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, *, background: bool = True) -> None:
        """Initialise NVML and discover devices (on worker threads), then start sampling.

        With ``background=False`` no loop runs: the caller drives rounds with
        :meth:`sample_round` (the benchmark and deterministic tests do).
        """
        self._system = await self._pool.call(init_nvml, within=self._settings.init_timeout)
        self._nvml_up = True
        for index in range(self._system.gpu_count):
            self._gpus.append(await self._discover_initial(index))
        _log.info(
            "nvml ready",
            driver_version=self._system.driver_version,
            gpus=self._system.gpu_count,
            devices=sum(1 for _ in self.devices()),
        )
        self.note_news()
        if not background:
            return
        self._tasks = [
            asyncio.create_task(self._loop(cadence, self._settings.interval(cadence)))
            for cadence in (Cadence.FAST, Cadence.SLOW)
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._renders, return_exceptions=True)
        self._tasks = []
        self._render_thread.shutdown(wait=False)
        if self._nvml_up:
            self._nvml_up = False
            try:
                await self._pool.call(pynvml.nvmlShutdown, within=1.0)
            except (TimeoutError, pynvml.NVMLError, PoolExhausted) as exc:
                # Hung calls may hold every thread; the process exits cleanly all the same.
                _log.warning("nvml shutdown failed", error=error_name(exc))

    def add_listener(self, listener: DeviceListener) -> None:
        self._listeners.append(listener)

    def add_round_listener(self, listener: RoundListener) -> None:
        self._round_listeners.append(listener)

    def add_source(self, source: SampleSource, *, frozen: bool = False) -> None:
        """Add ``source``'s series to the exposition, after those added before it. ``frozen``:
        the iterable its ``samples()`` returns (asked on the event loop) reads only values that
        nothing changes afterwards, a published snapshot, so a round's render writes it on the
        render thread instead of the loop."""
        self._sources.append((source, frozen))
        self._family_order = family_order(self._collector_types, self._sources)

    # -- what the HTTP side reads ------------------------------------------------------------

    @property
    def exposition(self) -> Exposition:
        """The exposition as of the last round, rendered now if it has not been since.

        Rendering waits for a reader: most rounds are never scraped (1 s rounds, 15 s scrapes),
        so the rounds between scrapes render nothing. While a round is rendered on a thread
        (:meth:`_publish_round`), reads get the previous one. Reading changes nothing else:
        a reader that serves the exposition says so with :meth:`note_read`."""
        if self._shown < self._news_count and self._ahead != self._news_count:
            self._shown = self._news_count
            self._exposition = render_blocks(blocks_of(self._parts()), self._family_order)
        return self._exposition

    async def read_exposition(self) -> Exposition:
        """:attr:`exposition` for a reader that can wait (``/metrics``): a round nobody read yet
        is rendered on a thread, the loop only gathering its parts (on ``mig56`` a render is
        ~7-14 ms of CPU that a scrape every 15 s would otherwise hold the loop for). A render
        ahead of the scrapers already in flight is not waited for: reads get the previous
        round meanwhile, as from :attr:`exposition`."""
        if self._shown < self._news_count:
            if self._rendering is None:
                # A task, claimed at once: a reader that hangs up must not stop the others' render.
                task = asyncio.create_task(self._render_until_shown(self._claim_render(True)))
                self._renders.add(task)
                task.add_done_callback(self._renders.discard)
            if self._on_demand and self._rendering is not None:
                self._ahead = self._news_count
                await asyncio.shield(self._rendering)
        return self.exposition  # still stale only if the thread's render failed: shows why

    def note_read(self) -> None:
        """A reader served the exposition (a scrape, the status page; on the event loop).
        While it is read every round, the next round formats its samples on the worker threads
        and is rendered on a thread as it settles, so that the next read finds it ready; rounds
        after which nobody read render nothing until a read."""
        self._read = self._read_since_fast_round = True

    @property
    def ready(self) -> bool:
        return all(self._round_counts.values())

    @property
    def system(self) -> SystemInfo | None:
        return self._system

    def devices(self) -> Iterator[Device]:
        for state in self._gpus:
            if state.gpu is not None:
                yield from state.gpu.devices()

    def unidentified_lost(self) -> list[int]:
        """Indexes of GPUs that have not answered since startup: lost, with no uuid to name."""
        return [state.index for state in self._gpus if not state.up and state.gpu is None]

    def healthy(self) -> bool:
        """The sampler is alive: its loops run and the fast round completed recently."""
        return loops_healthy(
            self._tasks, self._last_round_end, self._clock(), self._settings.fast_interval
        )

    def problems(self) -> list[str]:
        """What is degraded now, a line each (for ``/healthz``): lost GPUs, hung NVML calls and
        failing collectors. None of them makes the sampler unhealthy; the other GPUs carry on."""
        return problems(self._gpus, self._clock())

    async def wait_for_news(self) -> None:
        """Wait until the exposition next has news: a round settled or an event source told
        :meth:`note_news` (tests and callers that need fresh data await this, then read
        :attr:`exposition`)."""
        self._news.clear()
        await self._news.wait()

    async def wait_for_rounds(self, cadence: Cadence, count: int = 1) -> None:
        """Wait until ``count`` more rounds of ``cadence`` have completed."""
        target = self._round_counts[cadence] + count
        while self._round_counts[cadence] < target:
            await self.wait_for_news()

    # -- startup -----------------------------------------------------------------------------

    async def _discover_initial(self, index: int) -> GpuState:
        try:
            gpu = await self._pool.call(self._discovery(index), within=self._settings.init_timeout)
        except (DeviceLost, TimeoutError) as exc:
            _log.error("gpu did not answer at startup; will re-probe", gpu=index, error=str(exc))
            state = GpuState(index, None, Liveness.LOST)
            state.schedule_probe(self._clock())
            return state
        state = GpuState(index, gpu)
        state.jobs = self._make_jobs(gpu)
        return state

    def _make_jobs(self, gpu: Gpu) -> list[Job]:
        return make_jobs(gpu, self._collector_types, self._context, self._support, self._errors)

    # -- rounds ------------------------------------------------------------------------------

    async def _loop(self, cadence: Cadence, interval: float) -> None:
        # Phase 0: rounds tick on multiples of their interval of loop time, and other parts
        # that keep a fixed rate tick between them (AllocationSettings.phase).
        async for _ in ticks(interval, phase=0.0):
            await self.sample_round(cadence)

    async def sample_round(self, cadence: Cadence) -> None:
        """Sample every device for one cadence; on return the exposition shows it, or the next
        read renders it."""
        interval = self._settings.interval(cadence)
        try:
            await self._round(cadence, interval)
        except Exception:  # a bug in one round must not stop sampling forever
            _log.exception("sampling round failed", cadence=cadence.value)
        self._round_counts[cadence] += 1
        if cadence is Cadence.FAST:
            self._last_round_end = self._clock()
            self._round_done()
            self._scraped, self._read_since_fast_round = self._read_since_fast_round, False
        await self._publish_round()

    async def _round(self, cadence: Cadence, interval: float) -> None:
        """Submit this cadence's work, wait a bounded time, then settle what finished or hung."""
        work: dict[concurrent.futures.Future[Any], Pending] = {}
        if cadence is Cadence.FAST:
            self._submit_probes(work)
        if cadence is Cadence.SLOW or self._dcgm.take_change():
            self._submit_inventory(work)
        deadline = min(self._settings.nvml_timeout, interval)
        self._submit_jobs(cadence, work)
        await settle(work, deadline)

    def _submit(
        self,
        fn: Callable[[], Any],
        work: dict[concurrent.futures.Future[Any], Pending],
        pending: Pending,
    ) -> concurrent.futures.Future[Any] | None:
        try:
            future = self._pool.submit(fn)
        except PoolExhausted as exc:
            self._log_once(("pool",), "work not started", error=str(exc))
            return None
        work[future] = pending
        return future

    def _submit_jobs(
        self, cadence: Cadence, work: dict[concurrent.futures.Future[Any], Pending]
    ) -> None:
        """One batch per GPU (its MIG instances' jobs included) for this cadence; a job stuck in
        an earlier call is left out. While the exposition is being read (it was since the last
        round) the jobs format their lines on the workers, as the next read will want them."""
        format_now, self._read = self._read, False
        for state in self._gpus:
            if not state.up:
                continue
            ready = []
            for job in state.jobs:
                if job.collector.cadence is not cadence:
                    continue
                if job.hung:
                    job.ok = False  # still stuck in an earlier call: skip, keep the old samples
                else:
                    ready.append(job)
            if ready:
                self._submit_batch(state, Batch(ready, format_now=format_now), work)

    def _submit_batch(
        self, state: GpuState, batch: Batch, work: dict[concurrent.futures.Future[Any], Pending]
    ) -> None:
        future = self._submit(
            batch.run,
            work,
            Pending(
                partial(self._outcomes.done, state, batch),
                partial(self._outcomes.late, state, batch),
            ),
        )
        if future is not None:
            batch.future = future
            return
        for job in batch.jobs:
            job.ok = False

    # -- lost GPUs and inventory changes ----------------------------------------------------

    def _mark_lost(self, state: GpuState, exc: DeviceLost) -> None:
        if not state.lose(self._clock()):
            return
        _log.error("gpu lost; its series are withdrawn", gpu=state.index, function=exc.function)
        close_jobs(self._pool, state.jobs)
        state.jobs = []
        if state.gpu is not None:
            for device in state.gpu.devices():
                self._ledger.forget(device.uuid)
            lost = state.gpu.device.id
            self._tell_listeners(lambda listener: listener.device_lost(lost))

    def _submit_probes(self, work: dict[concurrent.futures.Future[Any], Pending]) -> None:
        """Probe lost GPUs when their backoff allows, and suspect ones at once."""
        now = self._clock()
        for state in self._gpus:
            if state.discovering or not state.probe_due(now):
                continue
            state.discovery = self._submit(
                self._discovery(state.index),
                work,
                Pending(partial(self._probe_result, state), partial(self._probe_late, state)),
            )

    def _probe_result(self, state: GpuState, future: concurrent.futures.Future[Gpu]) -> None:
        exc = future.exception()
        if state.suspect:
            self._confirm(state, exc)
            return
        if exc is not None:
            state.schedule_probe(self._clock())
            return
        gpu = future.result()
        self._support.forget(gpu.device.uuid)
        state.recover(gpu)
        state.jobs = self._make_jobs(gpu)
        _log.info("gpu is back", gpu=state.index, uuid=gpu.device.uuid)
        back = gpu.device.id
        self._tell_listeners(lambda listener: listener.device_recovered(back))

    def _confirm(self, state: GpuState, exc: BaseException | None) -> None:
        """Settle a suspected loss with the probe's answer."""
        if isinstance(exc, DeviceLost):
            self._mark_lost(state, exc)
            return
        state.dismiss()
        self._log_once(
            ("dismissed", state.index),
            "a call answered GpuIsLost but the GPU still answers; not treated as lost",
            gpu=state.index,
            probe_error=None if exc is None else repr(exc),
        )

    def _probe_late(self, state: GpuState) -> None:
        self._abandon_discovery(state)
        if not state.suspect:  # a suspect GPU is probed again next round
            state.schedule_probe(self._clock())

    def _abandon_discovery(self, state: GpuState) -> None:
        """A hung discovery is skipped until it returns; the next round tries again."""
        if state.discovery is not None:
            self._pool.abandon(state.discovery)

    def _submit_inventory(self, work: dict[concurrent.futures.Future[Any], Pending]) -> None:
        """Rediscover each GPU so a MIG reconfiguration is picked up (applied when it returns)."""
        for state in self._gpus:
            if not state.up or state.gpu is None or state.discovering:
                continue
            state.discovery = self._submit(
                self._discovery(state.index),
                work,
                Pending(
                    partial(self._apply_inventory, state, state.gpu),
                    partial(self._abandon_discovery, state),
                ),
            )

    def _apply_inventory(
        self, state: GpuState, previous: Gpu, future: concurrent.futures.Future[Gpu]
    ) -> None:
        exc = future.exception()
        if isinstance(exc, DeviceLost) and state.up:
            self._mark_lost(state, exc)
            return
        if exc is not None or state.gpu is not previous or not state.up:
            return  # failed this time, or replaced meanwhile: the next slow round tries again
        gpu = future.result()
        if [d.id for d in gpu.devices()] == [d.id for d in previous.devices()]:
            return
        if [d.id.layout for d in gpu.devices()] == [d.id.layout for d in previous.devices()]:
            # Only state changed (persistence or compute mode): relabel, keep the collectors.
            for old, new in zip(previous.devices(), gpu.devices(), strict=True):
                old.id = new.id
            self._identities.clear()
            return
        _log.info("device layout changed", gpu=state.index, devices=len(list(gpu.devices())))
        # What the GPU lacked may have been its MIG layout (remapped rows, utilisation, aggregate
        # memory answer NotSupported while instances exist): learn it again, once.
        self._support.forget(gpu.device.uuid)
        close_jobs(self._pool, state.jobs)
        self._identities.clear()
        state.gpu, state.jobs = gpu, self._make_jobs(gpu)

    def _remap_failed(self, device: DeviceId) -> None:
        """Called from a worker thread by the remap collector."""
        self._tell_listeners(lambda listener: listener.note_remap_failure(device))

    def _tell_listeners(self, tell: Callable[[DeviceListener], None]) -> None:
        for listener in self._listeners:
            try:
                tell(listener)
            except Exception:  # a listener's bug must not stop sampling or fail a collector
                _log.exception("device listener failed", listener=type(listener).__name__)

    def _round_done(self) -> None:
        for listener in self._round_listeners:
            try:
                listener.round_done()
            except Exception:  # a listener's bug must not stop sampling
                _log.exception("round listener failed", listener=type(listener).__name__)

    def _discovery(self, index: int) -> Callable[[], Gpu]:
        return partial(discover_gpu, index, self._support, self._errors, self._dcgm)

    # -- rendering ---------------------------------------------------------------------------

    def note_news(self) -> None:
        """An event source has news (called on the event loop): the next read of
        :attr:`exposition` renders again. Rounds publish theirs with :meth:`_publish_round`."""
        self._news_count += 1
        self._news.set()

    async def _publish_round(self) -> None:
        """A round settled. While scrapers read every round, render it now on a thread, so that
        the next scrape finds it ready instead of stalling the loop for it: only gathering the
        parts (reading their state, recording the sources' and self-metrics' values) stays on
        the loop; formatting, joining and gzip run on the thread. Scrapes meanwhile get the
        previous round's exposition. Unread rounds render on the next read.

        "Read every round" is a read since the last fast round settled, or in the fast interval
        before: a slow round settles just after the fast one of the same tick, before any
        scrape could come between them. A round that settles while another's render is on its
        thread joins that render (it renders once more when done) instead of leaving its own to
        the next scrape, on the loop."""
        self._news_count += 1
        if self._scraped or self._read_since_fast_round:
            if self._rendering is None:
                await self._render_until_shown(self._claim_render(False))
            else:
                self._ahead = self._news_count
                await asyncio.shield(self._rendering)
        self._news.set()

    def _claim_render(self, on_demand: bool) -> asyncio.Future[None]:
        self._rendering = asyncio.get_running_loop().create_future()
        self._on_demand = on_demand
        self._ahead = self._news_count
        return self._rendering

    async def _render_until_shown(self, rendering: asyncio.Future[None]) -> None:
        """Render on a thread until the exposition shows the newest news claimed by
        :attr:`_ahead` (a round that settled meanwhile, or a read, claims it again); then
        ``rendering`` is done."""
        try:
            while self._ahead is not None and self._shown < self._ahead:
                news = self._ahead
                parts = self._parts()
                gzipped = self._exposition.gzipped_formats()  # what the scrapers asked for
                try:
                    exposition = await asyncio.get_running_loop().run_in_executor(
                        self._render_thread, self._render, parts, gzipped
                    )
                except Exception:  # a bug: the next read renders on the loop and shows it
                    _log.exception("rendering the round failed")
                    return
                if self._shown < news:  # no read rendered newer news meanwhile
                    self._shown, self._exposition = news, exposition
        finally:
            self._ahead = self._rendering = None
            rendering.set_result(None)

    def _render(self, parts: list[Part], gzipped: tuple[bool, ...]) -> Exposition:
        """On a thread: the exposition of ``parts``, with the gzip bodies scrapers will ask for."""
        exposition = render_blocks(blocks_of(parts), self._family_order)
        for openmetrics in gzipped:
            exposition.body(openmetrics=openmetrics, gzipped=True)
        return exposition

    def _parts(self) -> list[Part]:
        jobs = (job for state in self._gpus for job in state.jobs)
        self_samples = self._self_metrics.samples(
            jobs,
            self._clock(),
            nvml_up=self._nvml_up,
            errors=self._errors,
            hung_calls=self._pool.abandoned_count,
        )
        return exposition_parts(
            self._system, self._gpus, self._identities, self._sources, self_samples
        )

    # -- helpers -----------------------------------------------------------------------------

    def _log_once(self, key: object, event: str, **fields: Any) -> None:
        self._rlog.warning(key, event, **fields)
