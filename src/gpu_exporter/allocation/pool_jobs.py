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

from ..nvml import CallTimedOut, WorkerPool

T = TypeVar("T")


class PoolJob:
    def __init__(self, name: str, timeout: float) -> None:
        self.name = name  # in the log's keys and events: "scan timed out"
        self.timeout = timeout
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
