"""The sampler's health (``/healthz``): alive or not, and what is degraded now."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from .liveness import GpuState


def loops_healthy(
    tasks: Sequence[asyncio.Task[None]],
    last_round_end: float | None,
    now: float,
    fast_interval: float,
) -> bool:
    """The sampler is alive: its loops run and the fast round completed recently."""
    if not tasks or any(task.done() for task in tasks):
        return False
    if last_round_end is None:
        return True  # still in the first round
    stall_limit = max(5 * fast_interval, 10.0)
    return now - last_round_end < stall_limit


def problems(gpus: Iterable[GpuState], now: float) -> list[str]:
    """What is degraded, a line each: lost GPUs, hung NVML calls and failing collectors."""
    lines = []
    for state in gpus:
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
