"""The simulated node as the exporter's :class:`~gpu_exporter.host.Host` (``--simulate``).

What the flags leave at their defaults is the simulated node's own, never the machine's: its
kernel log is a kmsg-format file it writes its Xid lines to, its journal goes to a scratch state
directory (a demo on a real GPU node must not journal simulated UUIDs under the real
``--state-dir``), its PCI bus is a sysfs tree written from the scenario, and, with allocation on,
the kubelet, ``/proc``, pod logs, CDI specs and ``nvidia-caps`` are a :class:`SimulatedKubelet`'s
(a socket or file location given on the command line wins: a stand-in kubelet in front of
simulated GPUs). The fake libnvidia-ml is under ``pynvml`` from the moment the host is built until
its ``close``; the fake libdcgm is what the DCGM service opens.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from gpu_exporter.config import Config
from gpu_exporter.host import Host, real_host
from gpu_exporter.simulator.control import make_routes
from gpu_exporter.simulator.install import install, uninstall
from gpu_exporter.simulator.kubelet import SimulatedKubelet
from gpu_exporter.simulator.loader import load_scenario
from gpu_exporter.simulator.node import SimulatedNode
from gpu_exporter.simulator.sysfs import write_pci_tree


@dataclass(frozen=True)
class SimulatedHost:
    """The node, its kubelet (with allocation on) and the :class:`Host` the exporter reads."""

    node: SimulatedNode
    kubelet: SimulatedKubelet | None
    host: Host


def simulated_host(config: Config) -> SimulatedHost:
    """The node of ``--simulate``'s scenario, at the places the flags leave to it.

    Raises :class:`~gpu_exporter.simulator.errors.ScenarioError` for a bad scenario and
    :class:`OSError` naming ``--kmsg-path`` where its kernel log cannot be created."""
    if config.simulator is None:
        raise ValueError("a simulated host is built only with --simulate")
    node = SimulatedNode(load_scenario(config.simulator.scenario))
    try:
        return _host_on(node, config)
    except BaseException:
        node.close()
        raise


def _host_on(node: SimulatedNode, config: Config) -> SimulatedHost:
    scratch = Path(tempfile.mkdtemp(prefix="gpu-exporter-sim-"))
    kmsg = scratch / "kmsg" if config.kmsg_path == Config.kmsg_path else config.kmsg_path
    try:
        kmsg.touch()
    except OSError as exc:  # e.g. --kmsg-path in a directory that does not exist
        why = exc.strerror or str(exc)
        raise OSError(
            f"--kmsg-path {kmsg}: cannot create the simulator's kernel log: {why}"
        ) from None
    node.add_kmsg_file(kmsg)
    host = replace(
        real_host(config),
        kmsg_path=kmsg,
        state_dir=scratch / "state" if config.state_dir == Config.state_dir else config.state_dir,
        sysfs_path=(
            write_pci_tree(node, scratch / "sys")
            if config.sysfs_path == Config.sysfs_path
            else config.sysfs_path
        ),
        boot_id=node.scenario.node.boot_id,
        routes=tuple(make_routes(node, remote=config.simulate_remote_events)),
    )
    if config.dcgm_target is not None:  # the binding and the fake engine only with --dcgm.*
        from gpu_exporter.dcgm.library import DcgmLibrary

        host = replace(host, dcgm_library=partial(DcgmLibrary, node.dcgm_library))
    # The simulated kubelet serves the allocation subsystem alone: without it, nothing to play.
    kubelet = SimulatedKubelet(node) if config.allocation else None
    if kubelet is not None:
        host = replace(
            host,
            pod_resources_socket=config.pod_resources_socket or kubelet.socket_path,
            proc_path=kubelet.proc_path,
            pod_logs_path=kubelet.pod_logs_path,
            cdi_spec_dirs=(
                (kubelet.cdi_spec_dir,)
                if config.cdi_spec_dirs == Config.cdi_spec_dirs
                else config.cdi_spec_dirs
            ),
            nvidia_caps_path=(
                kubelet.nvidia_caps_path
                if config.nvidia_caps_path == Config.nvidia_caps_path
                else config.nvidia_caps_path
            ),
        )

    async def start() -> None:
        if kubelet is not None:
            await kubelet.start()

    async def close() -> None:
        try:
            if kubelet is not None:
                await kubelet.close()
        finally:
            node.close()
            uninstall()

    install(node)  # from here on pynvml calls the node, until close
    return SimulatedHost(node, kubelet, replace(host, start=start, close=close))
