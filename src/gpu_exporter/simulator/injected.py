"""Faults injected into the simulated node: hung calls and NVML errors (a leaf: the node keeps
them, and the fake libraries ask the node for the one that applies to a call)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class Hang:
    """Calls to ``function`` (or every function) on ``gpu`` (or any) block until ``deadline``
    or release."""

    function: str | None
    gpu: int | None
    deadline: float | None
    released: threading.Event = field(default_factory=threading.Event)

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()


@dataclass
class Failure:
    """An injected NVML error on ``function``: every ``every``-th call fails (1: every call),
    and after ``times`` failures (None: no limit) the injection switches itself off."""

    code: int
    every: int = 1
    times: int | None = None
    calls: int = 0

    def strike(self) -> bool:
        """Count one call; True when this call fails."""
        self.calls += 1
        if self.calls % self.every:
            return False
        if self.times is not None:
            self.times -= 1
        return True

    @property
    def spent(self) -> bool:
        return self.times == 0
