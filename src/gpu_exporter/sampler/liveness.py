"""Whether each GPU answers: the liveness state machine, pure state (no NVML, no logging).

    UP --(a call answered GpuIsLost)--> SUSPECT --(the next fast round's probe fails)--> LOST
    SUSPECT --(the probe answers: only that read failed)--> UP
    LOST --(a probe, with exponential backoff 1 s .. 60 s, answers: a reset)--> UP

A GPU that never answered since startup starts LOST with no :class:`Gpu` (no uuid to name).
The sampler (``core.py``) drives the transitions and does what each implies: withdraw series,
close jobs, tell the listeners.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from enum import Enum

from ..devices import Gpu
from ..exposition import label_string
from .jobs import Job

MAX_PROBE_BACKOFF = 60.0


class Liveness(Enum):
    UP = "up"
    SUSPECT = "suspect"  # a call answered GpuIsLost; the next fast round's probe decides
    LOST = "lost"  # withdrawn; re-probed when ``next_probe`` comes


@dataclass(eq=False)
class GpuState:
    index: int
    gpu: Gpu | None
    liveness: Liveness = Liveness.UP
    jobs: list[Job] = field(default_factory=list)
    backoff: float = 1.0
    next_probe: float = 0.0
    discovery: concurrent.futures.Future[Gpu] | None = None  # a probe or inventory refresh

    @property
    def up(self) -> bool:
        """Serving series (a suspect GPU still is)."""
        return self.liveness is not Liveness.LOST

    @property
    def suspect(self) -> bool:
        return self.liveness is Liveness.SUSPECT

    @property
    def discovering(self) -> bool:
        return self.discovery is not None and not self.discovery.done()

    @property
    def up_labels(self) -> str:
        uuid = self.gpu.device.uuid if self.gpu else ""
        return label_string({"gpu": str(self.index), "uuid": uuid})

    def probe_due(self, now: float) -> bool:
        return self.suspect or (self.liveness is Liveness.LOST and now >= self.next_probe)

    def suspect_loss(self) -> bool:
        """UP -> SUSPECT; True when this changed the state (the caller logs it then)."""
        if self.liveness is not Liveness.UP:
            return False
        self.liveness = Liveness.SUSPECT
        return True

    def dismiss(self) -> None:
        """SUSPECT -> UP: the probe answered."""
        if self.suspect:
            self.liveness = Liveness.UP

    def lose(self, now: float) -> bool:
        """UP or SUSPECT -> LOST, the first probe a second away; False when already lost."""
        if self.liveness is Liveness.LOST:
            return False
        self.liveness = Liveness.LOST
        self.backoff = 1.0
        self.schedule_probe(now)
        return True

    def schedule_probe(self, now: float) -> None:
        self.next_probe = now + self.backoff
        self.backoff = min(self.backoff * 2, MAX_PROBE_BACKOFF)

    def recover(self, gpu: Gpu) -> None:
        """LOST -> UP with the GPU as the probe found it."""
        self.gpu, self.liveness, self.backoff = gpu, Liveness.UP, 1.0
