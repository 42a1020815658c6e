"""The host an exporter is built on: the machine's at the places the flags name, or a simulated
node's, which keeps every place the flags leave at their defaults off the machine (a demo on a
real GPU node must not read its kernel log, journal under its state directory or count its PCI
bus) and gives way to a place the command line names."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pynvml
import pytest

from gpu_exporter.config import DEFAULT_POD_RESOURCES_SOCKET, Config, SimulatorConfig
from gpu_exporter.host import real_host
from gpu_exporter.simulator.host import simulated_host
from tests.helpers import make_config

MACHINE = real_host(Config())


def test_the_real_host_is_every_place_the_flags_name(tmp_path: Path) -> None:
    config = make_config(
        kmsg_path=tmp_path / "kmsg",
        state_dir=tmp_path / "state",
        sysfs_path=tmp_path / "sys",
        proc_path=tmp_path / "proc",
        pod_resources_socket=tmp_path / "kubelet.sock",
        pod_logs_path=tmp_path / "pods",
        cdi_spec_dirs=(tmp_path / "cdi",),
        nvidia_caps_path=tmp_path / "caps",
    )
    host = real_host(config)
    for name in ("kmsg_path", "state_dir", "sysfs_path", "proc_path", "pod_logs_path"):
        assert getattr(host, name) == getattr(config, name), name
    assert host.pod_resources_socket == tmp_path / "kubelet.sock"
    assert host.cdi_spec_dirs == (tmp_path / "cdi",)
    assert host.nvidia_caps_path == tmp_path / "caps"
    assert host.boot_id is None, "read from /proc"
    assert host.routes == ()
    assert MACHINE.pod_resources_socket == DEFAULT_POD_RESOURCES_SOCKET


async def test_a_simulated_node_keeps_the_defaulted_places_off_the_machine() -> None:
    simulated = simulated_host(make_config(simulator=SimulatorConfig()))
    host = simulated.host
    try:
        assert simulated.kubelet is not None, "allocation is on: the node plays the kubelet"
        machine = {f.name: getattr(MACHINE, f.name) for f in fields(MACHINE)}
        for name in ("kmsg_path", "state_dir", "sysfs_path", "proc_path", "pod_resources_socket"):
            assert getattr(host, name) != machine[name], f"{name} is the machine's"
        assert host.kmsg_path.is_file(), "the node's kernel log, written as it logs Xids"
        assert len(list((host.sysfs_path / "bus" / "pci" / "devices").iterdir())) >= 8
        assert host.pod_resources_socket == simulated.kubelet.socket_path
        assert host.cdi_spec_dirs == (simulated.kubelet.cdi_spec_dir,)
        assert host.boot_id == simulated.node.scenario.node.boot_id
        paths = {route.path for route in host.routes}
        assert paths == {"/-/simulator/events", "/-/simulator/scenario"}, "the control API"
        assert pynvml.nvmlLib is simulated.node.library, "pynvml calls the node once built"
    finally:
        await host.close()
    assert pynvml.nvmlLib is None, "closed: pynvml back to its pristine state"


async def test_places_given_on_the_command_line_win(tmp_path: Path) -> None:
    config = make_config(
        simulator=SimulatorConfig(),
        kmsg_path=tmp_path / "kmsg",
        state_dir=tmp_path / "state",
        pod_resources_socket=tmp_path / "stand-in.sock",
        cdi_spec_dirs=(tmp_path / "cdi",),
    )
    host = simulated_host(config).host
    try:
        assert host.kmsg_path == tmp_path / "kmsg"
        assert host.state_dir == tmp_path / "state"
        assert host.pod_resources_socket == tmp_path / "stand-in.sock", "a stand-in kubelet"
        assert host.cdi_spec_dirs == (tmp_path / "cdi",)
    finally:
        await host.close()


def test_a_kernel_log_that_cannot_be_created_names_the_flag(tmp_path: Path) -> None:
    config = make_config(simulator=SimulatorConfig(), kmsg_path=tmp_path / "missing" / "kmsg")
    with pytest.raises(OSError, match=r"--kmsg-path .*missing/kmsg: cannot create"):
        simulated_host(config)
    assert pynvml.nvmlLib is None, "nothing installed by a host that was never built"
