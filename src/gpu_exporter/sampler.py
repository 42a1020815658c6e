"""The sampler: runs every collector on every device at its cadence, off the event loop.

Each (collector, device) pair is a *job*. A round submits the due jobs to the worker pool and
waits at most ``min(nvml_timeout, interval)``; a job still running then is abandoned (its thread is
replaced), counted as a timeout against the NVML function it was stuck in, and skipped in later
rounds until its call returns. Its last good samples stay in the exposition, and
``gpu_exporter_sample_age_seconds`` shows how old they are. So a hung call delays nothing else:
not other devices, not other collectors, not scrapes (which only ever read cached bytes).

A job that meets GpuIsLost makes its GPU *suspect*; the next fast round probes it. A GPU that
cannot even be looked up by index is lost: marked down (``gpu_up 0``), its series withdrawn, and
re-probed with exponential backoff until it answers (a reset). One that can is not: only that read
failed. The other GPUs carry on untouched either way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import pynvml

from . import identity
from .collectors import ALL_COLLECTORS, Cadence, Collector, CollectorContext, SampleWriter
from .config import Config
from .devices import Device, DeviceId, Gpu, SystemInfo, discover_gpu, read_system_info
from .exposition import Exposition, Family, Sample, counter, gauge, label_string, render
from .families import SOURCE_UP, source_up
from .ledger import ActivityLedger
from .logs import RateLimiter, get_logger
from .nvml import (
    DeviceCalls,
    DeviceLost,
    ErrorCounter,
    NvmlUnavailable,
    PoolExhausted,
    SupportRegistry,
    WorkerPool,
    error_name,
)
from .nvml.errors import is_unavailable

COLLECTOR_SUCCESS = gauge(
    "gpu_exporter_collector_success", "1 when the collector's last run succeeded on every device."
)
COLLECTOR_DURATION = gauge(
    "gpu_exporter_collector_duration_seconds",
    "Time the collector's last run spent on worker threads, summed over devices, in seconds.",
)
SAMPLE_AGE = gauge(
    "gpu_exporter_sample_age_seconds",
    "Age of the collector's oldest device sample now served, in seconds (grows while it fails).",
)
NVML_ERRORS = counter(
    "gpu_exporter_nvml_errors_total", "NVML calls that failed, by function and error."
)
HUNG_CALLS = gauge(
    "gpu_exporter_nvml_hung_calls", "NVML calls given up on after the timeout and still running."
)
SELF_FAMILIES = (
    COLLECTOR_SUCCESS,
    COLLECTOR_DURATION,
    SAMPLE_AGE,
    SOURCE_UP,
    NVML_ERRORS,
    HUNG_CALLS,
)

MAX_PROBE_BACKOFF = 60.0
_log = get_logger("sampler")


class DeviceListener(Protocol):
    """Told of hardware conditions the sampler sees: lost and recovered GPUs (on the event
    loop), and failed row remaps (from a worker thread, on every slow round while it stands)."""

    def device_lost(self, gpu: DeviceId) -> None: ...

    def device_recovered(self, gpu: DeviceId) -> None:
        """A GPU confirmed lost answers again: it was reset (or the node rebooted)."""

    def note_remap_failure(self, device: DeviceId) -> None: ...


class SampleSource(Protocol):
    """Series that other parts (Xid, allocation) add to the exposition; read on the event loop."""

    families: Sequence[Family]

    def samples(self) -> Iterable[Sample]: ...


@dataclass
class JobOutcome:
    samples: list[Sample]
    duration: float
    failures: list[tuple[str, str]]


@dataclass(frozen=True)
class _Pending:
    """What to do with submitted work when it finishes, or when the round gives up on it."""

    finished: Callable[[concurrent.futures.Future[Any]], None]
    late: Callable[[], None]


@dataclass(eq=False)
class Job:
    collector: Collector
    calls: DeviceCalls
    future: concurrent.futures.Future[JobOutcome] | None = None
    samples: list[Sample] = field(default_factory=list)
    ok: bool = True
    duration: float = 0.0
    last_success: float | None = None

    @property
    def name(self) -> str:
        return self.collector.name

    @property
    def hung(self) -> bool:
        return self.future is not None and not self.future.done()


@dataclass(eq=False)
class GpuState:
    index: int
    gpu: Gpu | None
    up: bool = True
    jobs: list[Job] = field(default_factory=list)
    backoff: float = 1.0
    next_probe: float = 0.0
    # A call answered GpuIsLost; the next fast round's probe (handle lookup by index) decides
    # whether the GPU is lost: a GPU that fell off the bus cannot even be looked up.
    suspect: bool = False
    discovery: concurrent.futures.Future[Gpu] | None = None  # a probe or inventory refresh

    @property
    def up_labels(self) -> str:
        uuid = self.gpu.device.uuid if self.gpu else ""
        return label_string({"gpu": str(self.index), "uuid": uuid})


class Sampler:
    def __init__(
        self,
        config: Config,
        pool: WorkerPool,
        *,
        collectors: Sequence[type[Collector]] = ALL_COLLECTORS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._pool = pool
        self._collector_types = tuple(c for c in collectors if c.name in config.collectors)
        self._clock = clock
        self.ledger = ActivityLedger()
        self._context = CollectorContext(
            config=config, clock=clock, ledger=self.ledger, on_remap_failure=self._remap_failed
        )
        self._support = SupportRegistry()
        self._errors = ErrorCounter()
        self._log_limiter = RateLimiter(period=60.0, clock=clock)
        self._raised: set[tuple[str, type[BaseException]]] = set()
        self._sources: list[SampleSource] = []
        self._identity_cache: dict[DeviceId, Sample] = {}
        self._collector_labels = {
            c.name: label_string({"collector": c.name}) for c in self._collector_types
        }
        self._listeners: list[DeviceListener] = []
        self._system: SystemInfo | None = None
        self._gpus: list[GpuState] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._round_counts = dict.fromkeys(Cadence, 0)
        self._last_round_end: float | None = None
        self._exposition = render([], ())
        self._family_order = self._all_families()
        self._rendered = asyncio.Event()
        self._nvml_up = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, *, background: bool = True) -> None:
        """Initialise NVML and discover devices (on worker threads), then start sampling.

        With ``background=False`` no loop runs: the caller drives rounds with
        :meth:`sample_round` (the benchmark and deterministic tests do).
        """
        self._system = await self._blocking(self._init_nvml, self._config.init_timeout)
        self._nvml_up = True
        for index in range(self._system.gpu_count):
            self._gpus.append(await self._discover_initial(index))
        _log.info(
            "nvml ready",
            driver_version=self._system.driver_version,
            gpus=self._system.gpu_count,
            devices=sum(1 for _ in self.devices()),
        )
        self._render()
        if not background:
            return
        self._tasks = [
            asyncio.create_task(self._loop(Cadence.FAST, self._config.fast_interval)),
            asyncio.create_task(self._loop(Cadence.SLOW, self._config.slow_interval)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._nvml_up:
            self._nvml_up = False
            try:
                await self._blocking(pynvml.nvmlShutdown, 1.0)
            except (TimeoutError, pynvml.NVMLError, PoolExhausted) as exc:
                # Hung calls may hold every thread; the process exits cleanly all the same.
                _log.warning("nvml shutdown failed", error=error_name(exc))

    def add_listener(self, listener: DeviceListener) -> None:
        self._listeners.append(listener)

    def add_source(self, source: SampleSource) -> None:
        self._sources.append(source)
        self._family_order = self._all_families()

    # -- what the HTTP side reads ------------------------------------------------------------

    @property
    def errors(self) -> ErrorCounter:
        """NVML error counts, shared with other parts that call NVML (process listing)."""
        return self._errors

    @property
    def exposition(self) -> Exposition:
        return self._exposition

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
        if not self._tasks or any(task.done() for task in self._tasks):
            return False
        if self._last_round_end is None:
            return True  # still in the first round
        stall_limit = max(5 * self._config.fast_interval, 10.0)
        return self._clock() - self._last_round_end < stall_limit

    def problems(self) -> list[str]:
        """What is degraded now, a line each (for ``/healthz``): lost GPUs, hung NVML calls and
        failing collectors. None of them makes the sampler unhealthy; the other GPUs carry on."""
        now = self._clock()
        lines = []
        for state in self._gpus:
            if not state.up:
                lines.append(f"gpu {state.index}: lost; re-probing")
                continue
            for job in state.jobs:
                where = f"gpu {state.index} {job.calls.uuid} {job.name}"
                age = (
                    "never sampled"
                    if job.last_success is None
                    else (f"serving samples {now - job.last_success:.0f} s old")
                )
                if job.hung:
                    function = job.calls.current_function or "an NVML call"
                    lines.append(f"{where}: {function} hung; {age}")
                elif not job.ok:
                    lines.append(f"{where}: failing; {age}")
        return lines

    async def wait_for_render(self) -> None:
        """Wait for the next render (tests and callers that need fresh data await this)."""
        self._rendered.clear()
        await self._rendered.wait()

    async def wait_for_rounds(self, cadence: Cadence, count: int = 1) -> None:
        """Wait until ``count`` more rounds of ``cadence`` have completed and been rendered."""
        target = self._round_counts[cadence] + count
        while self._round_counts[cadence] < target:
            await self.wait_for_render()

    # -- startup -----------------------------------------------------------------------------

    @staticmethod
    def _init_nvml() -> SystemInfo:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            if is_unavailable(exc):
                raise NvmlUnavailable(str(exc)) from exc
            raise
        return read_system_info()

    async def _discover_initial(self, index: int) -> GpuState:
        try:
            gpu = await self._blocking(self._discovery(index), self._config.init_timeout)
        except (DeviceLost, TimeoutError) as exc:
            _log.error("gpu did not answer at startup; will re-probe", gpu=index, error=str(exc))
            state = GpuState(index, None, up=False)
            self._schedule_probe(state)
            return state
        state = GpuState(index, gpu)
        state.jobs = self._make_jobs(gpu)
        return state

    def _make_jobs(self, gpu: Gpu) -> list[Job]:
        jobs = []
        for device in gpu.devices():
            for collector_type in self._collector_types:
                if collector_type.applies_to(device):
                    collector = collector_type(device, self._context)
                    calls = DeviceCalls(
                        device.uuid,
                        self._support,
                        self._errors,
                        collector=collector.name,
                        lost_uuid=device.gpu_uuid,
                    )
                    jobs.append(Job(collector, calls))
        return jobs

    # -- rounds ------------------------------------------------------------------------------

    async def _loop(self, cadence: Cadence, interval: float) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            await self.sample_round(cadence)
            next_tick += interval
            now = loop.time()
            if next_tick < now:  # overran: skip missed ticks rather than burst
                next_tick = now
            await asyncio.sleep(next_tick - now)

    async def sample_round(self, cadence: Cadence) -> None:
        """Sample every device for one cadence, then render the exposition."""
        interval = (
            self._config.fast_interval if cadence is Cadence.FAST else self._config.slow_interval
        )
        try:
            await self._round(cadence, interval)
        except Exception:  # a bug in one round must not stop sampling forever
            _log.exception("sampling round failed", cadence=cadence.value)
        self._round_counts[cadence] += 1
        if cadence is Cadence.FAST:
            self._last_round_end = self._clock()
        self._render()

    async def _round(self, cadence: Cadence, interval: float) -> None:
        """Submit this cadence's work, wait a bounded time, then settle what finished or hung."""
        work: dict[concurrent.futures.Future[Any], _Pending] = {}
        if cadence is Cadence.FAST:
            self._submit_probes(work)
        else:
            self._submit_inventory(work)
        self._submit_jobs(cadence, work)
        if not work:
            return
        # Wake the event loop once, when the last piece of work finishes, not once per job: a
        # per-job asyncio future costs a self-pipe write, a loop iteration and a GIL hand-off.
        loop = asyncio.get_running_loop()
        all_done: asyncio.Future[None] = loop.create_future()
        remaining = len(work)
        lock = threading.Lock()

        def one_done(_: concurrent.futures.Future[Any]) -> None:
            nonlocal remaining
            with lock:
                remaining -= 1
                last = remaining == 0
            if last:
                loop.call_soon_threadsafe(_resolve, all_done)

        for future in list(work):
            future.add_done_callback(one_done)
        with suppress(TimeoutError):
            await asyncio.wait_for(all_done, min(self._config.nvml_timeout, interval))
        for future, pending in work.items():
            if future.done():
                pending.finished(future)
            else:
                pending.late()

    def _submit(
        self,
        fn: Callable[[], Any],
        work: dict[concurrent.futures.Future[Any], _Pending],
        pending: _Pending,
    ) -> concurrent.futures.Future[Any] | None:
        try:
            future = self._pool.submit(fn)
        except PoolExhausted as exc:
            self._log_once(("pool",), "work not started", error=str(exc))
            return None
        work[future] = pending
        return future

    def _submit_jobs(
        self, cadence: Cadence, work: dict[concurrent.futures.Future[Any], _Pending]
    ) -> None:
        for state in self._gpus:
            if not state.up:
                continue
            for job in state.jobs:
                if job.collector.cadence is not cadence:
                    continue
                if job.hung:
                    job.ok = False  # still stuck in an earlier call: skip, keep the old samples
                    continue
                job.calls.failures = []
                job.future = self._submit(
                    partial(_run, job),
                    work,
                    _Pending(partial(self._finish, state, job), partial(self._give_up, job)),
                )
                if job.future is None:
                    job.ok = False

    def _finish(
        self, state: GpuState, job: Job, future: concurrent.futures.Future[JobOutcome]
    ) -> None:
        exc = future.exception()
        if isinstance(exc, DeviceLost):
            job.ok = False
            if state.up and not state.suspect:
                state.suspect = True  # confirmed or dismissed by the next fast round's probe
                self._log_once(
                    ("suspect", state.index),
                    "gpu may be lost; probing it",
                    gpu=state.index,
                    function=exc.function,
                )
            return
        if exc is not None:
            job.ok = False
            self._collector_raised(job, exc)
            return
        outcome = future.result()
        job.samples = outcome.samples
        job.duration = outcome.duration
        job.ok = not outcome.failures
        job.last_success = self._clock()
        if outcome.failures:
            self._log_once(
                (job.name, job.calls.uuid, "nvml"),
                "nvml calls failed",
                collector=job.name,
                uuid=job.calls.uuid,
                failures=[f"{function}: {error}" for function, error in outcome.failures],
            )

    def _collector_raised(self, job: Job, exc: BaseException) -> None:
        """A collector raised something that is not an NVML error: a bug. Its traceback is logged
        once per (collector, exception type); repeats are rate-limited one-line warnings."""
        key = (job.name, type(exc))
        if key not in self._raised:
            self._raised.add(key)
            _log.error(
                "collector raised; this is a bug",
                collector=job.name,
                uuid=job.calls.uuid,
                exc_info=exc,
            )
            return
        self._log_once(
            (job.name, job.calls.uuid, type(exc).__name__),
            "collector failed",
            collector=job.name,
            uuid=job.calls.uuid,
            error=repr(exc),
        )

    def _give_up(self, job: Job) -> None:
        function = job.calls.current_function or "unknown"
        if job.future is not None:
            self._pool.abandon(job.future)
        job.ok = False
        self._errors.add(function, "timeout")
        self._log_once(
            (job.name, job.calls.uuid, "timeout"),
            "nvml call timed out; serving the last samples",
            collector=job.name,
            uuid=job.calls.uuid,
            function=function,
            timeout_s=self._config.nvml_timeout,
        )

    # -- lost GPUs and inventory changes ----------------------------------------------------

    def _mark_lost(self, state: GpuState, exc: DeviceLost) -> None:
        if not state.up:
            return
        state.up = False
        state.backoff = 1.0
        state.suspect = False
        self._schedule_probe(state)
        _log.error("gpu lost; its series are withdrawn", gpu=state.index, function=exc.function)
        self._close_jobs(state.jobs)
        state.jobs = []
        if state.gpu is not None:
            for device in state.gpu.devices():
                self.ledger.forget(device.uuid)
            lost = state.gpu.device.id
            self._tell_listeners(lambda listener: listener.device_lost(lost))

    def _schedule_probe(self, state: GpuState) -> None:
        state.next_probe = self._clock() + state.backoff
        state.backoff = min(state.backoff * 2, MAX_PROBE_BACKOFF)

    def _submit_probes(self, work: dict[concurrent.futures.Future[Any], _Pending]) -> None:
        """Probe lost GPUs when their backoff allows, and suspect ones at once."""
        now = self._clock()
        for state in self._gpus:
            busy = state.discovery is not None and not state.discovery.done()
            due = state.suspect or (not state.up and now >= state.next_probe)
            if busy or not due:
                continue
            state.discovery = self._submit(
                self._discovery(state.index),
                work,
                _Pending(partial(self._probe_result, state), partial(self._probe_late, state)),
            )

    def _probe_result(self, state: GpuState, future: concurrent.futures.Future[Gpu]) -> None:
        exc = future.exception()
        if state.suspect:
            self._confirm(state, exc)
            return
        if exc is not None:
            self._schedule_probe(state)
            return
        gpu = future.result()
        self._support.forget(gpu.device.uuid)
        state.gpu, state.up, state.backoff = gpu, True, 1.0
        state.jobs = self._make_jobs(gpu)
        _log.info("gpu is back", gpu=state.index, uuid=gpu.device.uuid)
        back = gpu.device.id
        self._tell_listeners(lambda listener: listener.device_recovered(back))

    def _confirm(self, state: GpuState, exc: BaseException | None) -> None:
        """Settle a suspected loss with the probe's answer."""
        state.suspect = False
        if isinstance(exc, DeviceLost):
            self._mark_lost(state, exc)
            return
        self._log_once(
            ("dismissed", state.index),
            "a call answered GpuIsLost but the GPU still answers; not treated as lost",
            gpu=state.index,
            probe_error=None if exc is None else repr(exc),
        )

    def _probe_late(self, state: GpuState) -> None:
        self._abandon_discovery(state)
        if not state.suspect:  # a suspect GPU is probed again next round
            self._schedule_probe(state)

    def _abandon_discovery(self, state: GpuState) -> None:
        """A hung discovery is skipped until it returns; the next round tries again."""
        if state.discovery is not None:
            self._pool.abandon(state.discovery)

    def _submit_inventory(self, work: dict[concurrent.futures.Future[Any], _Pending]) -> None:
        """Rediscover each GPU so a MIG reconfiguration is picked up (applied when it returns)."""
        for state in self._gpus:
            busy = state.discovery is not None and not state.discovery.done()
            if not state.up or state.gpu is None or busy:
                continue
            state.discovery = self._submit(
                self._discovery(state.index),
                work,
                _Pending(
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
        _log.info("device layout changed", gpu=state.index, devices=len(list(gpu.devices())))
        self._close_jobs(state.jobs)
        self._identity_cache.clear()  # rebuilt on the next render; drops vanished instances
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

    def _discovery(self, index: int) -> Callable[[], Gpu]:
        return partial(discover_gpu, index, self._support, self._errors)

    def _close_jobs(self, jobs: list[Job]) -> None:
        def close_all() -> None:
            for job in jobs:
                with suppress(Exception):  # the device may be gone; nothing left to release
                    job.collector.close(job.calls)

        with suppress(PoolExhausted, RuntimeError):
            self._pool.submit(close_all)

    # -- rendering ---------------------------------------------------------------------------

    def render_now(self) -> None:
        """Re-render at once (an event source calls this on the event loop when it has news)."""
        self._render()

    def _render(self) -> None:
        self._exposition = render(self._collect_samples(), self._family_order)
        self._rendered.set()

    def _collect_samples(self) -> Iterator[Sample]:
        yield identity.build_info(self._system)
        for state in self._gpus:
            if state.gpu is not None:
                devices = state.gpu.devices() if state.up else iter((state.gpu.device,))
                yield from map(self._identity_sample, devices)
            yield identity.up_sample(state.up_labels, state.up)
        for state in self._gpus:
            for job in state.jobs:
                yield from job.samples
        for source in self._sources:
            yield from source.samples()
        yield from self._self_samples()

    def _identity_sample(self, device: Device) -> Sample:
        """``gpu_info``/``gpu_mig_info``, built once per device identity, not on every render."""
        sample = self._identity_cache.get(device.id)
        if sample is None:
            driver = self._system.driver_version if self._system else ""
            sample = next(identity.identity_samples((device,), driver))
            self._identity_cache[device.id] = sample
        return sample

    def _self_samples(self) -> Iterator[Sample]:
        now = self._clock()
        by_collector: dict[str, list[Job]] = {c.name: [] for c in self._collector_types}
        for state in self._gpus:
            for job in state.jobs:
                by_collector[job.name].append(job)
        for name, jobs in by_collector.items():
            labels = self._collector_labels[name]
            yield Sample(COLLECTOR_SUCCESS, labels, 1.0 if all(j.ok for j in jobs) else 0.0)
            yield Sample(COLLECTOR_DURATION, labels, sum(j.duration for j in jobs))
            ages = [now - (j.last_success or now) for j in jobs]
            yield Sample(SAMPLE_AGE, labels, max(ages, default=0.0))
        yield source_up("nvml", self._nvml_up)
        for (function, error), count in sorted(self._errors.snapshot().items()):
            yield Sample(NVML_ERRORS, label_string({"function": function, "error": error}), count)
        yield Sample(HUNG_CALLS, "", float(self._pool.abandoned_count))

    def _all_families(self) -> list[Family]:
        families: list[Family] = list(identity.FAMILIES)
        for collector_type in self._collector_types:
            families.extend(collector_type.families)
        for source in self._sources:
            families.extend(source.families)
        families.extend(SELF_FAMILIES)
        return families

    # -- helpers -----------------------------------------------------------------------------

    async def _blocking(self, fn: Callable[[], Any], limit: float) -> Any:
        future = self._pool.submit(fn)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), limit)
        except TimeoutError:
            self._pool.abandon(future)
            raise

    def _log_once(self, key: object, event: str, **fields: Any) -> None:
        suppressed = self._log_limiter.allow(key)
        if suppressed is not None:
            _log.warning(event, suppressed=suppressed, **fields)


def _run(job: Job) -> JobOutcome:
    """The worker-thread side of a job."""
    started = time.perf_counter()
    writer = SampleWriter(job.collector.device.id.labels)
    job.collector.collect(job.calls, writer)
    return JobOutcome(writer.samples, time.perf_counter() - started, list(job.calls.failures))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
