"""The sampler: runs every collector on every device at its cadence, off the event loop.

Each (collector, device) pair is a *job*. A round submits the due jobs to the worker pool and
waits at most ``min(nvml_timeout, interval)``; a job still running then is abandoned (its thread is
replaced), counted as a timeout against the NVML function it was stuck in, and skipped in later
rounds until its call returns. Its last good samples stay in the exposition, and
``gpu_exporter_sample_age_seconds`` shows how old they are. So a hung call delays nothing else:
not other devices, not other collectors, not scrapes (which only ever read what rounds left: the
exposition is rendered from the jobs' last blocks by the first read after a round, and served as
cached bytes until the next).

A job that meets GpuIsLost makes its GPU *suspect*; the next fast round probes it. A GPU that
cannot even be looked up by index is lost: marked down (``gpu_up 0``), its series withdrawn, and
re-probed with exponential backoff until it answers (a reset). One that can is not: only that read
failed. The other GPUs carry on untouched either way.

Rooms: ``core.py`` (rounds: submit, wait, settle), ``liveness.py`` (the lost/suspect/backoff state
machine of each GPU), ``jobs.py`` (a job and its worker-thread side), ``rendering.py`` (what the
exposition holds, in order), ``selfmetrics.py`` (the sampler's own series), ``health.py``
(``/healthz``), ``sources.py`` (the protocols other parts implement).
"""

from .core import Sampler, SamplerSettings
from .liveness import MAX_PROBE_BACKOFF, GpuState, Liveness
from .selfmetrics import SELF_FAMILIES
from .sources import DeviceListener, RoundListener, SampleSource

__all__ = [
    "MAX_PROBE_BACKOFF",
    "SELF_FAMILIES",
    "DeviceListener",
    "GpuState",
    "Liveness",
    "RoundListener",
    "SampleSource",
    "Sampler",
    "SamplerSettings",
]
