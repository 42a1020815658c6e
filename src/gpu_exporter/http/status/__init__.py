"""The node status page (``/`` and ``/status.json``): one node's GPUs, holders, health and recent
Xids at a glance, for the SRE who port-forwards to the exporter before opening Grafana.

It is built from the exposition the sampler last rendered (:mod:`.reader`), never from NVML, so
the page shows exactly what ``/metrics`` shows and costs no driver call; :mod:`.model` turns the
series into rows, :mod:`.page` renders HTML and JSON, and :class:`StatusPage` caches both per
render, as the exposition itself is cached.
"""

from .cache import StatusPage, StatusView
from .model import NodeStatus, UnheldProcess, build_status

__all__ = ["NodeStatus", "StatusPage", "StatusView", "UnheldProcess", "build_status"]
