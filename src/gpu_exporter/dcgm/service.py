"""The DCGM activity source's event-loop side: keep a session up, read it, publish what it says.

Every DCGM call runs on the shared worker pool and is awaited for a bounded time, never on the
event loop. A call still running at its deadline is abandoned as a hung NVML call is (its thread
is replaced), counted as ``error="timeout"``, and the session it belongs to is given up: nothing
else is asked of it until the call returns, then it is closed and a new one opened.

- Engine not there (at start or later): ``gpu_exporter_source_up{source="dcgm"} 0``, everything
  else is served, and connecting is retried with exponential backoff (1 s doubling to 60 s).
- Engine restarted: calls on the old connection answer CONNECTION_NOT_VALID (the client has no
  reconnect logic [reference/dcgm.md section 1]); the session is dropped and the next poll
  connects again and re-creates its groups and watches. The exporter keeps running
  (dcgm-exporter exits here [gpu_collector.go 102-108]).
- Profiling not available for a GPU (IN_USE: another profiler holds the counters;
  PROFILING_NOT_SUPPORTED, REQUIRES_ROOT, ...): that GPU's activity is omitted, one log line
  says why, ``gpu_exporter_dcgm_unwatched_devices{reason}`` counts it, and every reconnect (and
  every ``RECHECK_S``) asks again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from typing import Any, TypeVar

from ..devices import Device
from ..exposition import Family, Sample, counter, gauge, label_string
from ..families import SOURCE_UP, source_up
from ..logs import RateLimiter, get_logger
from ..nvml import CallTimedOut, PoolExhausted, WorkerPool
from .library import DcgmError, DcgmLibrary, FieldValue
from .readings import DcgmLink, DcgmSnapshot, FieldSample
from .session import CONNECTION_LOST, Names, Session, WantedDevice
from .target import Target

T = TypeVar("T")
_log = get_logger("dcgm")

DCGM_ERRORS = counter(
    "gpu_exporter_dcgm_errors_total", "DCGM calls that failed, by function and error."
)
DCGM_UNWATCHED = gauge(
    "gpu_exporter_dcgm_unwatched_devices",
    "Devices without GPM whose activity DCGM does not serve, by reason (in_use, not_found, ...).",
)
FAMILIES: tuple[Family, ...] = (SOURCE_UP, DCGM_ERRORS, DCGM_UNWATCHED)
MAX_BACKOFF = 60.0
# A session with unwatched devices is re-opened this often to ask again (another profiler may
# have let go of the counters).
RECHECK_S = 300.0


class DcgmService:
    """A SampleSource (self-metrics) and the DcgmReadings the activity collectors read."""

    families: Sequence[Family] = FAMILIES

    def __init__(
        self,
        *,
        library: Callable[[], DcgmLibrary],
        target: Target,
        devices: Callable[[], Iterable[Device]],
        link: DcgmLink,
        executor: WorkerPool,
        interval: float = 1.0,
        call_timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._library_factory = library
        self._library: DcgmLibrary | None = None
        self._target = target
        self._devices = devices
        self._link = link
        link.readings = self  # the activity collectors of served devices read from here
        self._executor = executor
        self._interval = interval
        self._timeout = call_timeout
        self._clock = clock
        self._names = Names()
        self._limiter = RateLimiter(period=60.0, clock=clock)
        self._lock = threading.Lock()
        self._latest: dict[str, DcgmSnapshot] = {}
        self._session: Session | None = None
        self._wanted: tuple[WantedDevice, ...] = ()
        self._opened_at = 0.0
        self._generation = 0
        self._up = False
        self._backoff = 1.0
        self._next_attempt = 0.0
        self._hung: concurrent.futures.Future[Any] | None = None
        self._hung_session: Session | None = None
        self._errors: Counter[tuple[str, str]] = Counter()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        session, self._session = self._session, None
        if session is not None:
            await self._call(session, session.close, "close")

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await self.poll()
            except Exception:  # a bug in one poll must not end the source
                _log.exception("dcgm poll failed")
            await asyncio.sleep(self._interval)

    # -- what others read -----------------------------------------------------------------

    @property
    def up(self) -> bool:
        return self._up

    def latest(self, uuid: str) -> DcgmSnapshot | None:
        with self._lock:
            return self._latest.get(uuid)

    def samples(self) -> Iterable[Sample]:
        yield source_up("dcgm", self._up)
        reasons = Counter(self._session.unwatched.values()) if self._session else Counter()
        for reason, number in sorted(reasons.items()):
            yield Sample(DCGM_UNWATCHED, label_string({"reason": reason}), float(number))
        for (function, error), number in sorted(self._errors.items()):
            labels = label_string({"function": function, "error": error})
            yield Sample(DCGM_ERRORS, labels, float(number))

    # -- one poll (public so tests can drive it without the loop) --------------------------

    async def poll(self) -> None:
        if self._hung is not None:
            if not self._hung.done():
                self._set_down("a dcgm call is hung", function=self._hung_function())
                return
            await self._close_hung()
        wanted = self._wanted_devices()
        session = self._session
        if session is not None and self._stale(session, wanted):
            self._session = None
            await self._call(session, session.close, "close")
            session = None
        if session is None:
            if self._clock() >= self._next_attempt:
                await self._open(wanted)
            return
        await self._read(session)

    def _wanted_devices(self) -> tuple[WantedDevice, ...]:
        return tuple(
            WantedDevice(d.uuid, d.id.model, d.id.parent_uuid, d.id.gpu_instance_id)
            for d in self._devices()
            if not d.id.gpm_supported  # GPM stays the source wherever the GPU has it
        )

    def _stale(self, session: Session, wanted: tuple[WantedDevice, ...]) -> bool:
        """Re-open when the devices changed, or to re-ask about unwatched ones."""
        if wanted != self._wanted:
            return True
        return bool(session.unwatched) and self._clock() - self._opened_at >= RECHECK_S

    async def _open(self, wanted: tuple[WantedDevice, ...]) -> None:
        if not wanted:
            return
        interval_us = max(100_000, int(self._interval * 1e6))  # DCGM's minimum is 100 ms
        session: Session | None = None
        try:
            if self._library is None:
                self._library = await self._bounded(self._library_factory, "dlopen", None)
            session = Session(self._library, self._target, self._names, interval_us)
            opening = session
            await self._bounded(lambda: opening.open(wanted), "open", session)
        except (DcgmError, TimeoutError) as exc:
            self._set_down("cannot use the dcgm host engine; retrying", error=str(exc))
            self._retry_later()
            if isinstance(exc, DcgmError) and session is not None:
                await self._call(session, session.close, "close")
            return
        self._session, self._wanted, self._opened_at = session, wanted, self._clock()
        self._generation += 1
        self._backoff = 1.0
        self._up = True
        for uuid, reason in sorted(session.unwatched.items()):
            self._log_once(
                ("unwatched", uuid, reason), "dcgm does not serve", uuid=uuid, reason=reason
            )
        _log.info(
            "dcgm connected",
            target=self._target.describe(),
            served=len(session.served),
            unwatched=len(session.unwatched),
        )
        self._link.serve(session.served.values())
        await self._read(session)

    async def _read(self, session: Session) -> None:
        try:
            records = await self._bounded(session.read, "read", session)
        except (DcgmError, TimeoutError) as exc:
            if isinstance(exc, DcgmError) and exc.code not in CONNECTION_LOST:
                self._log_once(("read", exc.name), "dcgm read failed", error=str(exc))
                return
            self._session = None
            self._set_down("dcgm connection lost; reconnecting", error=str(exc))
            if isinstance(exc, DcgmError):
                await self._call(session, session.close, "close")
            return
        self._up = True
        snapshots = {
            uuid: DcgmSnapshot(self._generation, {f: _sample(r) for f, r in fields.items()})
            for uuid, fields in records.items()
        }
        with self._lock:
            self._latest = snapshots

    # -- helpers --------------------------------------------------------------------------

    async def _bounded(self, fn: Callable[[], T], step: str, session: Session | None) -> T:
        """Run ``fn`` on a worker thread for at most the call timeout; count DCGM errors. A
        call that hangs takes its session with it (closed once the call returns: :meth:`poll`)."""
        try:
            return await self._executor.call(fn, within=self._timeout)
        except PoolExhausted as exc:
            raise TimeoutError(str(exc)) from exc
        except CallTimedOut as exc:
            function = (session.lib.current_function if session else None) or step
            self._errors[(function, "timeout")] += 1
            self._hung, self._hung_session = exc.future, session
            self._session = None
            raise
        except DcgmError as exc:
            self._errors[(exc.function or step, exc.name)] += 1
            raise

    async def _call(self, session: Session, fn: Callable[[], None], step: str) -> None:
        """A best-effort step (closing): failures are counted, not raised."""
        with suppress(DcgmError, TimeoutError):
            await self._bounded(fn, step, session)

    async def _close_hung(self) -> None:
        session, self._hung, self._hung_session = self._hung_session, None, None
        if session is not None:
            await self._call(session, session.close, "close")

    def _hung_function(self) -> str:
        session = self._hung_session
        return (session.lib.current_function if session else None) or "unknown"

    def _set_down(self, event: str, **fields: Any) -> None:
        was_up, self._up = self._up, False
        with self._lock:
            self._latest = {}
        if was_up:
            _log.warning(event, target=self._target.describe(), **fields)
        else:
            self._log_once(("down", event), event, target=self._target.describe(), **fields)

    def _retry_later(self) -> None:
        self._next_attempt = self._clock() + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF)

    def _log_once(self, key: object, event: str, **fields: Any) -> None:
        suppressed = self._limiter.allow(key)
        if suppressed is not None:
            _log.warning(event, suppressed=suppressed, **fields)


def _sample(record: FieldValue) -> FieldSample:
    value = record.value
    number = float(value) if isinstance(value, int | float) else None
    return FieldSample(record.ts_us, number)
