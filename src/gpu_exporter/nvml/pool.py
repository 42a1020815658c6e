"""Worker threads for blocking NVML calls, where a hung call costs one thread and nothing else.

NVML calls cannot be cancelled from Python (reference/nvml.md): a call stuck in the driver keeps
its thread. The pool lets the caller *abandon* such a job: a replacement worker starts so capacity
stays the same, and the stuck worker exits quietly if its call ever returns. The number of
abandoned threads is capped so a device that hangs every call cannot grow the process unbounded.

Work that wants one answer within a deadline awaits :meth:`WorkerPool.call`; a round that waits
for many jobs at once submits them and settles them itself (``sampler/jobs.settle``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[concurrent.futures.Future[Any], Callable[[], Any]]


class PoolExhausted(RuntimeError):
    """Too many workers are stuck in hung calls to accept more work."""


class CallTimedOut(TimeoutError):
    """A :meth:`WorkerPool.call` got no answer within its deadline; its worker was abandoned.

    ``future`` is the call's own: it completes if the call ever returns, which tells a caller
    that keeps state tied to the call (a DCGM session) when it may be cleaned up."""

    def __init__(self, timeout: float, future: concurrent.futures.Future[Any]) -> None:
        super().__init__(f"no answer within {timeout:g} s")
        self.timeout = timeout
        self.future = future


class WorkerPool:
    def __init__(self, size: int, *, max_abandoned: int = 32, name: str = "nvml") -> None:
        self._size = size
        self._max_abandoned = max_abandoned
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)  # an abandoned call returned
        self._abandoned: set[concurrent.futures.Future[Any]] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False
        for _ in range(size):
            self._start_worker()

    @property
    def abandoned_count(self) -> int:
        with self._lock:
            return len(self._abandoned)

    def wait_for_abandoned(self, timeout: float) -> bool:
        """Block until every abandoned call has returned; False if some are still stuck."""
        with self._released:
            return self._released.wait_for(lambda: not self._abandoned, timeout)

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        with self._lock:
            if self._closed:
                raise RuntimeError("worker pool is shut down")
            if len(self._abandoned) >= self._max_abandoned:
                raise PoolExhausted(f"{len(self._abandoned)} workers stuck in hung NVML calls")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((future, fn))
        return future

    async def call(self, fn: Callable[[], T], *, within: float) -> T:
        """``fn()`` on a worker thread, awaited for at most ``within`` seconds.

        Raises what ``fn`` raised; :class:`CallTimedOut` when it has not returned by then (the
        worker is abandoned: replaced, the call left to finish on its own thread);
        :class:`PoolExhausted` when too many workers are stuck to start it. The deadline is the
        pool's to keep, not an ``asyncio.timeout`` around the await: only the pool can abandon
        the worker."""
        future = self.submit(fn)
        waiting = asyncio.wrap_future(future)
        # asyncio.wait, not wait_for (see sampler/jobs.settle): Python 3.11's wait_for swallows
        # a cancellation that arrives as the call returns, and a stopping caller never stops.
        done, _ = await asyncio.wait((waiting,), timeout=within)
        if not done:
            self.abandon(future)
            raise CallTimedOut(within, future)
        return waiting.result()

    def abandon(self, future: concurrent.futures.Future[Any]) -> None:
        """Give up on a running job: its worker is replaced and exits when the call returns."""
        with self._lock:
            if future.done() or future in self._abandoned or self._closed:
                return
            self._abandoned.add(future)
        if not future.cancel():  # already running: the worker is stuck in it
            self._start_worker()
        else:
            with self._lock:
                self._abandoned.discard(future)

    def shutdown(self) -> None:
        """Stop idle workers; stuck ones are daemon threads and die with the process."""
        with self._lock:
            self._closed = True
            count = len(self._threads)
        for _ in range(count):
            self._jobs.put(None)

    def _start_worker(self) -> None:
        thread = threading.Thread(
            target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
        )
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:  # delivered to the awaiting coroutine, not lost
                future.set_exception(exc)
            else:
                future.set_result(result)
            with self._lock:
                was_abandoned = future in self._abandoned
                self._abandoned.discard(future)
                if was_abandoned:
                    self._threads.remove(threading.current_thread())
                    self._released.notify_all()
            if was_abandoned:
                return  # a replacement took this worker's place while it was stuck
