"""The worker pool: a hung call costs one thread, never the pool's capacity."""

from __future__ import annotations

import threading

import pytest

from gpu_exporter.nvml import PoolExhausted, WorkerPool


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
