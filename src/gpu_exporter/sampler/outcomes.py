"""What a round's batches mean for their jobs: samples kept, a hung call given up on, a
suspected GPU loss, a collector's bug logged (on the event loop, after the round's wait)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

from ..exposition import Block
from ..logs import RateLimitedLog, get_logger
from ..nvml import DeviceLost, ErrorCounter, WorkerPool
from .jobs import Batch, Job
from .liveness import GpuState

_log = get_logger("sampler")


class Outcomes:
    """Applies finished and late batches to their jobs; logs rate-limited, tracebacks once."""

    def __init__(
        self,
        pool: WorkerPool,
        errors: ErrorCounter,
        rlog: RateLimitedLog,
        *,
        clock: Callable[[], float],
        nvml_timeout: float,
    ) -> None:
        self._pool = pool
        self._errors = errors
        self._rlog = rlog
        self._clock = clock
        self._nvml_timeout = nvml_timeout
        self._raised: set[tuple[str, type[BaseException]]] = set()

    def done(self, state: GpuState, batch: Batch, future: concurrent.futures.Future[Any]) -> None:
        for job in batch.jobs:
            self._finish(state, job)

    def late(self, state: GpuState, batch: Batch) -> None:
        """The round's deadline passed: finish what ran, give up on the call that hangs."""
        batch.abandoned = True
        for job in batch.jobs:
            if job.running:
                self._give_up(job, batch)
            elif job.outcome is not None:
                self._finish(state, job)
            else:
                job.ok = False  # queued behind the hung call: not run this round

    def _finish(self, state: GpuState, job: Job) -> None:
        outcome = job.outcome
        if isinstance(outcome, DeviceLost):
            job.ok = False
            if state.suspect_loss():  # confirmed or dismissed by the next fast round's probe
                self._rlog.warning(
                    ("suspect", state.index),
                    "gpu may be lost; probing it",
                    gpu=state.index,
                    function=outcome.function,
                )
            return
        if not isinstance(outcome, Block):
            job.ok = False
            if outcome is not None:
                self._collector_raised(job, outcome)
            return
        job.block = outcome
        job.duration = job.outcome_duration
        job.ok = not job.outcome_failures
        job.last_success = self._clock()
        if job.outcome_failures:
            self._rlog.warning(
                (job.name, job.calls.uuid, "nvml"),
                "nvml calls failed",
                collector=job.name,
                uuid=job.calls.uuid,
                failures=[f"{function}: {error}" for function, error in job.outcome_failures],
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
        self._rlog.warning(
            (job.name, job.calls.uuid, type(exc).__name__),
            "collector failed",
            collector=job.name,
            uuid=job.calls.uuid,
            error=repr(exc),
        )

    def _give_up(self, job: Job, batch: Batch) -> None:
        function = job.calls.current_function or "unknown"
        if batch.future is not None:
            self._pool.abandon(batch.future)
        job.ok = False
        self._errors.add(function, "timeout")
        self._rlog.warning(
            (job.name, job.calls.uuid, "timeout"),
            "nvml call timed out; serving the last samples",
            collector=job.name,
            uuid=job.calls.uuid,
            function=function,
            timeout_s=self._nvml_timeout,
        )
