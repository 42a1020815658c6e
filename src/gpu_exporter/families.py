"""Families that several parts publish into, defined once (a leaf: it imports only the
exposition's types, which import nothing of ours).

A family one part owns lives with that part (a collector's in its module, ``xid/metrics.py``,
``allocation/metrics.py``, ``sampler/selfmetrics.py``). A family more than one part writes
series into goes here, so no part imports another only for a family definition.
"""

from __future__ import annotations

from .exposition import Sample, gauge, label_string

SOURCE_UP = gauge("gpu_exporter_source_up", "1 when the data source answers, else 0.")


def source_up(source: str, up: bool) -> Sample:
    """``gpu_exporter_source_up{source=...}``: nvml, kmsg, nvml_events, kubelet, ..."""
    return Sample(SOURCE_UP, label_string({"source": source}), 1.0 if up else 0.0)
