"""Kubernetes allocation against GPU activity (kubelet pod-resources, cgroups, idle accounting).

``AllocationSubsystem`` is imported lazily: :mod:`gpu_exporter.identity` may import
:func:`idle_activity_source` from here, and the subsystem imports the sampler, which imports
identity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .accounting import idle_activity_source

if TYPE_CHECKING:
    from .subsystem import AllocationSubsystem

__all__ = ["AllocationSubsystem", "idle_activity_source"]


def __getattr__(name: str) -> Any:
    if name == "AllocationSubsystem":
        from .subsystem import AllocationSubsystem

        return AllocationSubsystem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
