"""Putting the fake library under the real ``pynvml`` module, and taking it out again."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pynvml

if TYPE_CHECKING:
    from gpu_exporter.simulator.node import SimulatedNode


def install(node: SimulatedNode) -> None:
    """Make ``pynvml`` use ``node.library`` instead of ``libnvidia-ml.so.1``.

    The library, pynvml's function-pointer cache and its init refcount are swapped together:
    the cache would otherwise keep handing out the previous library's functions.
    """
    _swap(node.library)


def uninstall() -> None:
    """Restore pynvml to its pristine state (no library loaded, empty cache, refcount 0)."""
    _swap(None)


def _swap(library: object) -> None:
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
