"""The sampler's own series: per-collector success and sample age (what the kit alerts on), the
duration with ``--collector-durations``; NVML errors and hung calls; the NVML source's
``gpu_exporter_source_up``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..exposition import Sample, counter, gauge, label_string
from ..families import SOURCE_UP, source_up
from ..nvml import ErrorCounter
from .jobs import Job

COLLECTOR_SUCCESS = gauge(
    "gpu_exporter_collector_success", "1 when the collector's last run succeeded on every device."
)
COLLECTOR_DURATION = gauge(
    "gpu_exporter_collector_duration_seconds",
    "Time the collector's last run spent on worker threads, summed over devices, in seconds.",
)
SAMPLE_AGE = gauge(
    "gpu_exporter_sample_age_seconds",
    "Age of the collector's oldest device sample now served, in seconds (grows while it fails).",
)
NVML_ERRORS = counter(
    "gpu_exporter_nvml_errors_total", "NVML calls that failed, by function and error."
)
HUNG_CALLS = gauge(
    "gpu_exporter_nvml_hung_calls", "NVML calls given up on after the timeout and still running."
)
SELF_FAMILIES = (
    COLLECTOR_SUCCESS,
    COLLECTOR_DURATION,
    SAMPLE_AGE,
    SOURCE_UP,
    NVML_ERRORS,
    HUNG_CALLS,
)


class SelfMetrics:
    """Renders the self-metrics; collector label strings are built once."""

    def __init__(self, collector_names: Iterable[str], *, durations: bool = False) -> None:
        self._labels = {name: label_string({"collector": name}) for name in collector_names}
        self._durations = durations

    def samples(
        self,
        jobs: Iterable[Job],
        now: float,
        *,
        nvml_up: bool,
        errors: ErrorCounter,
        hung_calls: int,
    ) -> Iterator[Sample]:
        by_collector: dict[str, list[Job]] = {name: [] for name in self._labels}
        for job in jobs:
            by_collector[job.name].append(job)
        for name, mine in by_collector.items():
            labels = self._labels[name]
            yield Sample(COLLECTOR_SUCCESS, labels, 1.0 if all(j.ok for j in mine) else 0.0)
            if self._durations:
                yield Sample(COLLECTOR_DURATION, labels, sum(j.duration for j in mine))
            ages = [now - (j.last_success or now) for j in mine]
            yield Sample(SAMPLE_AGE, labels, max(ages, default=0.0))
        yield source_up("nvml", nvml_up)
        for (function, error), count in sorted(errors.snapshot().items()):
            yield Sample(NVML_ERRORS, label_string({"function": function, "error": error}), count)
        yield Sample(HUNG_CALLS, "", float(hung_calls))
