"""What the Xid subsystem is configured with (:class:`XidSettings`, from flags in ``app.py``),
kept apart from what tests put in place of the clock, the kernel and the disk (:class:`XidHooks`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Config
from .classes import Classifier
from .kmsg import SYSLOG_POLL_S, KmsgSyscalls
from .statedir import Write
from .syslog import ReadAll


@dataclass(frozen=True)
class XidSettings:
    """``kmsg_path`` None: no kernel-log source. ``/dev/kmsg`` falls back to ``syslog(2)`` when
    the device cannot be opened; ``syslog:`` reads through ``syslog(2)`` only. ``state_dir``
    None: no journal. ``boot_id`` None: read from ``proc_path``."""

    kmsg_path: Path | None
    state_dir: Path | None
    proc_path: Path = Config.proc_path
    classes_path: Path | None = None
    nvml_events: bool = True
    boot_id: str | None = None
    pod_series_retention: float | None = None
    dedup_window: float = 5.0
    poll_interval: float = 0.05
    nvml_wait_ms: int = 250
    nvml_grace: float = 0.3
    syslog_poll: float = SYSLOG_POLL_S
    housekeeping_interval: float = 10.0


@dataclass(frozen=True)
class XidHooks:
    """Stand-ins: ``syslog`` replaces the ``klogctl`` call (tests feed it buffers),
    ``journal_write`` the journal's ``os.write`` (a disk that fills up), ``classifier`` the one
    loaded from ``classes_path``."""

    clock: Callable[[], float] = time.time
    uptime: Callable[[], float] = time.monotonic
    classifier: Classifier | None = None
    syslog: ReadAll | None = None
    journal_write: Write = os.write
    kmsg_syscalls: KmsgSyscalls | None = None


_SETTINGS = frozenset(f.name for f in dataclasses.fields(XidSettings))
_HOOKS = frozenset(f.name for f in dataclasses.fields(XidHooks))


def split_options(
    settings: XidSettings | None, hooks: XidHooks | None, options: Mapping[str, Any]
) -> tuple[XidSettings, XidHooks]:
    """Apply keyword ``options`` (any field of either, by name) over ``settings`` and ``hooks``."""
    unknown = set(options) - _SETTINGS - _HOOKS
    if unknown:
        raise TypeError(f"XidSubsystem: unknown option(s) {', '.join(sorted(unknown))}")
    mine = {k: v for k, v in options.items() if k in _SETTINGS}
    if settings is None:
        settings = XidSettings(**mine)
    elif mine:
        settings = dataclasses.replace(settings, **mine)
    hook_options = {k: v for k, v in options.items() if k in _HOOKS}
    hooks = dataclasses.replace(hooks or XidHooks(), **hook_options)
    return settings, hooks
