"""The worker pool: a hung call costs one thread, never the pool's capacity. A bounded call
(``WorkerPool.call``) answers, raises, or gives up at its deadline, leaving the hung thread."""

from __future__ import annotations

import os
import threading

import pytest

from gpu_exporter.app import _pool_size
from gpu_exporter.nvml import CallTimedOut, PoolExhausted, WorkerPool


def test_runs_jobs_and_returns_results() -> None:
    pool = WorkerPool(size=2)
    try:
        assert pool.submit(lambda: 21 * 2).result(timeout=5) == 42
    finally:
        pool.shutdown()


def test_exceptions_reach_the_caller() -> None:
    pool = WorkerPool(size=1)
    try:
        future = pool.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            future.result(timeout=5)
    finally:
        pool.shutdown()


def test_abandoning_a_hung_job_keeps_the_pool_serving() -> None:
    pool = WorkerPool(size=1)
    release = threading.Event()
    started = threading.Event()

    def hang() -> str:
        started.set()
        release.wait(10)
        return "late"

    try:
        hung = pool.submit(hang)
        assert started.wait(5)
        pool.abandon(hung)
        assert pool.abandoned_count == 1
        assert not pool.wait_for_abandoned(0.01), "the hung call has not returned yet"
        # The only original worker is stuck; the replacement serves new work.
        assert pool.submit(lambda: "fresh").result(timeout=5) == "fresh"
        release.set()
        assert pool.wait_for_abandoned(5)
        assert hung.result(timeout=5) == "late"
        assert pool.abandoned_count == 0
    finally:
        release.set()
        pool.shutdown()


def test_too_many_hung_jobs_refuse_new_work_instead_of_growing_forever() -> None:
    pool = WorkerPool(size=1, max_abandoned=1)
    release = threading.Event()
    started = threading.Event()

    def hang() -> None:
        started.set()
        release.wait(10)

    try:
        hung = pool.submit(hang)
        assert started.wait(5)
        pool.abandon(hung)
        with pytest.raises(PoolExhausted):
            pool.submit(lambda: None)
        release.set()
        hung.result(timeout=5)
        assert pool.submit(lambda: "ok").result(timeout=5) == "ok"
    finally:
        release.set()
        pool.shutdown()


# -- one bounded call: WorkerPool.call --------------------------------------------------------


async def test_a_call_answers_from_a_worker_thread() -> None:
    pool = WorkerPool(size=1, name="answers")
    try:
        thread = await pool.call(lambda: threading.current_thread().name, within=5)
    finally:
        pool.shutdown()
    assert thread.startswith("answers-"), f"the call ran on {thread}, not on a pool worker"


async def test_a_call_raises_what_the_function_raised() -> None:
    pool = WorkerPool(size=1)
    try:
        with pytest.raises(ZeroDivisionError):
            await pool.call(lambda: 1 / 0, within=5)
    finally:
        pool.shutdown()


async def test_a_call_past_its_deadline_is_abandoned_and_the_pool_keeps_serving() -> None:
    pool = WorkerPool(size=1)
    release = threading.Event()

    def hang() -> str:
        release.wait(10)
        return "late"

    try:
        with pytest.raises(CallTimedOut, match=r"no answer within 0\.05 s") as timed_out:
            await pool.call(hang, within=0.05)
        assert isinstance(timed_out.value, TimeoutError), "callers that catch TimeoutError miss it"
        assert pool.abandoned_count == 1, "the hung call's worker was not abandoned"
        assert await pool.call(lambda: "fresh", within=5) == "fresh", "no worker took its place"
        hung = timed_out.value.future
        assert not hung.done(), "the hung call was reported finished while it still ran"
        release.set()
        assert hung.result(timeout=5) == "late", "the error's future is not the call's own"
        assert pool.wait_for_abandoned(5)
    finally:
        release.set()
        pool.shutdown()


async def test_a_call_is_refused_while_too_many_workers_are_stuck() -> None:
    pool = WorkerPool(size=1, max_abandoned=1)
    release = threading.Event()
    try:
        with pytest.raises(CallTimedOut):
            await pool.call(lambda: release.wait(10), within=0.05)
        with pytest.raises(PoolExhausted):
            await pool.call(lambda: "never started", within=5)
    finally:
        release.set()
        pool.shutdown()


@pytest.mark.parametrize(
    ("cpus", "workers"),
    [(1, 2), (2, 2), (6, 6), (16, 16), (128, 16)],
)
def test_the_exporter_runs_one_worker_per_cpu_it_may_use_two_to_sixteen(
    monkeypatch: pytest.MonkeyPatch, cpus: int, workers: int
) -> None:
    """Workers beyond the CPUs only queue for the GIL, and the event loop queues behind them;
    two at least, so that one hung call never holds up every other device."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4096)  # the host's count is not the answer
    assert _pool_size() == workers
