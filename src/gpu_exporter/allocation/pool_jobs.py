"""One kind of work the allocation subsystem hands the worker pool: a process scan, a
per-process activity read, a topology read, a Slurm read.

Each call is bounded (:meth:`WorkerPool.call`). A call that timed out keeps its worker busy
until the hung NVML call or command returns; until then the job reports itself
:attr:`~PoolJob.stuck` and its next run is skipped, so threads never pile up behind one hang.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

from ..logs import RateLimitedLog
from ..nvml import CallTimedOut, PoolExhausted, WorkerPool

T = TypeVar("T")


class PoolJob:
    def __init__(self, name: str, timeout: float, log: RateLimitedLog) -> None:
        self.name = name  # in the log's keys and events: "scan timed out"
        self.timeout = timeout
        self._log = log
        self._hung: concurrent.futures.Future[Any] | None = None

    @property
    def stuck(self) -> bool:
        """An earlier call timed out and has not returned yet."""
        return self._hung is not None and not self._hung.done()

    async def call(self, pool: WorkerPool, fn: Callable[[], T]) -> T:
        """``fn()`` on ``pool`` within the timeout; raises what :meth:`WorkerPool.call` raises."""
        try:
            return await pool.call(fn, within=self.timeout)
        except CallTimedOut as exc:
            self._hung = exc.future
            raise

    async def run(self, pool: WorkerPool, fn: Callable[[], T]) -> T | None:
        """:meth:`call`, but None, and a rate-limited warning, when ``fn`` timed out or could
        not start (what ``fn`` raised itself still propagates)."""
        try:
            return await self.call(pool, fn)
        except CallTimedOut:
            self._log.warning(
                f"{self.name}-timeout", f"{self.name} timed out", timeout_s=self.timeout
            )
        except PoolExhausted as exc:
            self._log.warning(f"{self.name}-submit", f"{self.name} not started", error=str(exc))
        return None
