"""The node the exporter reads: where each of its inputs comes from, as one frozen value.

Everything the exporter reads of the machine it runs on goes through a :class:`Host`: NVML
(through ``pynvml``, which loads ``libnvidia-ml.so.1`` at the first ``nvmlInit``), the DCGM
library, the kubelet's pod-resources socket, ``/proc``, the pod logs, the CDI spec directories,
``nvidia-caps``, the kernel log, sysfs and the state directory it keeps its journal in; with
the boot id when the host knows it better than ``/proc`` does, the HTTP routes it adds, and what
it does before the exporter starts and after the exporter has stopped.

:func:`real_host` is the machine's, from the flags. A simulated node builds its own
(``simulator/host.py``: its library is under ``pynvml`` from the moment it is built until its
``close``); ``cli.host_for`` picks one, and ``app.build_exporter`` reads nothing else of the
host, so the exporter cannot tell the two apart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from .config import DEFAULT_POD_RESOURCES_SOCKET, Config

if TYPE_CHECKING:  # the binding is imported only when a DCGM source is built
    from .dcgm.library import DcgmLibrary


async def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Host:
    """Where the exporter finds each of the node's inputs; the parts read these, never the
    flags of the same name (which only build the real one)."""

    sysfs_path: Path  # the PCI bus (GPUs dead at boot) and NUMA locality
    kmsg_path: Path  # the kernel log Xids are read from
    state_dir: Path  # where the Xid journal is kept
    proc_path: Path  # processes to containers; the boot id
    pod_resources_socket: Path
    pod_logs_path: Path
    cdi_spec_dirs: tuple[Path, ...]
    nvidia_caps_path: Path
    # Opens the DCGM library; called on a worker thread (a dlopen may block), once per service.
    dcgm_library: Callable[[], DcgmLibrary]
    boot_id: str | None = None  # None: read from proc_path
    routes: tuple[web.RouteDef, ...] = ()  # served beside the exporter's own
    start: Callable[[], Awaitable[None]] = _nothing  # before NVML is first called
    close: Callable[[], Awaitable[None]] = _nothing  # after every part has stopped


def real_host(config: Config) -> Host:
    """This machine, at the places the flags name."""
    return Host(
        sysfs_path=config.sysfs_path,
        kmsg_path=config.kmsg_path,
        state_dir=config.state_dir,
        proc_path=config.proc_path,
        pod_resources_socket=config.pod_resources_socket or DEFAULT_POD_RESOURCES_SOCKET,
        pod_logs_path=config.pod_logs_path,
        cdi_spec_dirs=config.cdi_spec_dirs,
        nvidia_caps_path=config.nvidia_caps_path,
        dcgm_library=load_dcgm_library,
    )


def load_dcgm_library() -> DcgmLibrary:
    """``libdcgm.so.4`` (``DCGM_ST_LIBRARY_NOT_FOUND`` if absent)."""
    from .dcgm.library import DcgmLibrary

    return DcgmLibrary.load()
