"""Jobs: one (collector, device) pair each, run on a worker thread once per round of its cadence."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from ..collectors import Collector, CollectorContext, SampleWriter
from ..devices import Gpu
from ..exposition import EMPTY_BLOCK, Block
from ..nvml import DeviceCalls, ErrorCounter, PoolExhausted, SupportRegistry, WorkerPool


@dataclass(frozen=True)
class Pending:
    """What to do with submitted work when it finishes, or when the round gives up on it."""

    finished: Callable[[concurrent.futures.Future[Any]], None]
    late: Callable[[], None]


@dataclass(eq=False)
class Job:
    collector: Collector
    calls: DeviceCalls
    block: Block = EMPTY_BLOCK  # the last run's samples, rendered once
    ok: bool = True
    duration: float = 0.0
    last_success: float | None = None
    # Written by the worker thread: True while collect() runs (still True at the start of a
    # later round: stuck in a hung call), and what this round's run gave: its block or what it
    # raised (None: not run yet), how long it took and the calls that failed. Fields, not an
    # outcome object: an object per job and round would outlive the round's young garbage
    # collections and be promoted to the old generation, which then fills up the sooner.
    running: bool = False
    outcome: Block | BaseException | None = None
    outcome_duration: float = 0.0
    outcome_failures: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return self.collector.name

    @property
    def hung(self) -> bool:
        """Still in a call from an earlier round (the sampler asks between rounds)."""
        return self.running


class Batch:
    """One device's jobs of one cadence, run in turn on one worker thread.

    One pool task per device and round, not one per job: a task costs a future, a queue hand-off
    and a thread wake-up, which on an 8-GPU node came to more than the collectors' own work. A
    hung call still holds up only its own collector: the sampler gives up on the batch at the
    round's deadline (the job running then is the hung one; those after it did not run this
    round), and the next round leaves the hung job out of the device's new batch. An abandoned
    batch whose call returns runs nothing more.
    """

    __slots__ = ("abandoned", "format_now", "future", "jobs")

    def __init__(self, jobs: Sequence[Job], *, format_now: bool = False) -> None:
        self.jobs = tuple(jobs)
        self.format_now = format_now  # format the samples here, off the loop (see run_job)
        self.abandoned = False
        self.future: concurrent.futures.Future[None] | None = None
        for job in self.jobs:
            job.outcome = None
            job.calls.failures.clear()

    def run(self) -> None:
        for job in self.jobs:
            if self.abandoned:
                return
            self._run_one(job)

    def _run_one(self, job: Job) -> None:
        job.running = True
        try:
            run_job(job, format_now=self.format_now)
        except BaseException as exc:  # delivered to the sampler on the loop, not lost
            job.outcome = exc
        finally:
            job.running = False


def make_jobs(
    gpu: Gpu,
    collector_types: Sequence[type[Collector]],
    context: CollectorContext,
    support: SupportRegistry,
    errors: ErrorCounter,
) -> list[Job]:
    """A job for every collector that applies to each of ``gpu``'s devices (MIG included)."""
    jobs = []
    for device in gpu.devices():
        for collector_type in collector_types:
            if collector_type.applies_to(device):
                collector = collector_type(device, context)
                calls = DeviceCalls(
                    device.uuid,
                    support,
                    errors,
                    collector=collector.name,
                    lost_uuid=device.gpu_uuid,
                )
                jobs.append(Job(collector, calls))
    return jobs


def close_jobs(pool: WorkerPool, jobs: list[Job]) -> None:
    """Release what the jobs' collectors hold, on a worker thread (NVML calls), best effort."""

    def close_all() -> None:
        for job in jobs:
            with suppress(Exception):  # the device may be gone; nothing left to release
                job.collector.close(job.calls)

    with suppress(PoolExhausted, RuntimeError):
        pool.submit(close_all)


def run_job(job: Job, *, format_now: bool = False) -> None:
    """The worker-thread side of a job: runs its collector, sets its outcome. With
    ``format_now`` (the exposition is being read: a scraper is there) its lines are formatted
    here rather than by the read that renders them, which would hold the event loop; otherwise
    formatting waits for a read that may never come (exposition.Block)."""
    started = time.perf_counter()
    writer = SampleWriter(job.collector.device.id.labels)
    job.collector.collect(job.calls, writer)
    block = writer.block(job.block)
    if format_now:
        block.format()
    job.outcome_duration = time.perf_counter() - started
    job.outcome_failures = tuple(job.calls.failures)
    job.outcome = block  # last: the sampler reads it first


async def settle(work: dict[concurrent.futures.Future[Any], Pending], wait_s: float) -> None:
    """Wait at most ``wait_s`` for all ``work``, then tell each piece it finished or is late.

    The event loop wakes once, when the last piece finishes, not once per job: a per-job asyncio
    future costs a self-pipe write, a loop iteration and a GIL hand-off.
    """
    if not work:
        return
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
    # asyncio.wait, not wait_for: Python 3.11's wait_for swallows a cancellation (Sampler.stop)
    # that arrives as all_done resolves, and the round loop then never ends.
    await asyncio.wait((all_done,), timeout=wait_s)
    for future, pending in work.items():
        if future.done():
            pending.finished(future)
        else:
            pending.late()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
